//! The `uploads` table: files staged on the servers to deploy as models. The bytes live
//! on one server's disk while they arrive, then there or in S3; this table says where,
//! how many have arrived and whether the file is complete.

use gantry_types::{Timestamp, Upload, UploadCreate, UploadState};
use sqlx::any::AnyRow;

use crate::rows::{int, opt_text, parse_enum, text};
use crate::{Store, StoreError};

const COLUMNS: &str =
    "id, name, size, received, state, sha256, location, created_by, created_at, updated_at";
const T: &str = "uploads";

fn state_name(state: UploadState) -> &'static str {
    match state {
        UploadState::Uploading => "uploading",
        UploadState::Ready => "ready",
    }
}

fn decode(row: &AnyRow) -> Result<Upload, StoreError> {
    let size = |column: &str| {
        let value = int(row, T, column)?;
        u64::try_from(value)
            .map_err(|_| StoreError::corrupt(T, format!("column {column}: {value} is negative")))
    };
    Ok(Upload {
        id: int(row, T, "id")?,
        name: text(row, T, "name")?,
        size: size("size")?,
        bytes_received: size("received")?,
        state: parse_enum(
            &text(row, T, "state")?,
            |s| match s {
                "uploading" => Some(UploadState::Uploading),
                "ready" => Some(UploadState::Ready),
                _ => None,
            },
            T,
            "state",
        )?,
        sha256: opt_text(row, T, "sha256")?,
        location: text(row, T, "location")?,
        created_by: int(row, T, "created_by")?,
        created_at: Timestamp::from_millis(int(row, T, "created_at")?),
        updated_at: Timestamp::from_millis(int(row, T, "updated_at")?),
    })
}

fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A complete upload: its digest and where it is kept now.
#[derive(Debug, Clone)]
pub struct UploadDone {
    pub sha256: String,
    pub location: String,
}

impl Store {
    /// Records a new upload, with nothing received yet, kept at `location`.
    pub async fn create_upload(
        &self,
        new: &UploadCreate,
        location: &str,
        created_by: i64,
    ) -> Result<Upload, StoreError> {
        let now = Timestamp::now().as_millis();
        let row = sqlx::query(&format!(
            "INSERT INTO uploads (name, size, received, state, sha256, location, created_by, \
             created_at, updated_at) VALUES ($1, $2, 0, 'uploading', $3, $4, $5, $6, $6) \
             RETURNING {COLUMNS}"
        ))
        .bind(&new.name)
        .bind(signed(new.size))
        .bind(new.sha256.as_ref().map(|d| d.to_ascii_lowercase()))
        .bind(location)
        .bind(created_by)
        .bind(now)
        .fetch_one(&self.writes)
        .await?;
        decode(&row)
    }

    pub async fn get_upload(&self, id: i64) -> Result<Upload, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM uploads WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| StoreError::not_found("upload", id))?;
        decode(&row)
    }

    /// Every upload, newest first.
    pub async fn list_uploads(&self) -> Result<Vec<Upload>, StoreError> {
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM uploads ORDER BY id DESC"))
            .fetch_all(&self.reads)
            .await?;
        rows.iter().map(decode).collect()
    }

    /// Records how many bytes of an upload still receiving have arrived.
    pub async fn set_upload_received(&self, id: i64, received: u64) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE uploads SET received = $2, updated_at = $3 WHERE id = $1 AND state = 'uploading'",
        )
        .bind(id)
        .bind(signed(received))
        .bind(Timestamp::now().as_millis())
        .execute(&self.writes)
        .await?;
        Ok(())
    }

    /// Marks an upload complete: every byte received, its digest, where it is kept.
    pub async fn finish_upload(&self, id: i64, done: &UploadDone) -> Result<Upload, StoreError> {
        let row = sqlx::query(&format!(
            "UPDATE uploads SET received = size, state = $2, sha256 = $3, location = $4, \
             updated_at = $5 WHERE id = $1 RETURNING {COLUMNS}"
        ))
        .bind(id)
        .bind(state_name(UploadState::Ready))
        .bind(&done.sha256)
        .bind(&done.location)
        .bind(Timestamp::now().as_millis())
        .fetch_optional(&self.writes)
        .await?
        .ok_or_else(|| StoreError::not_found("upload", id))?;
        decode(&row)
    }

    pub async fn delete_upload(&self, id: i64) -> Result<(), StoreError> {
        let result = sqlx::query("DELETE FROM uploads WHERE id = $1")
            .bind(id)
            .execute(&self.writes)
            .await?;
        if result.rows_affected() == 0 {
            return Err(StoreError::not_found("upload", id));
        }
        Ok(())
    }
}
