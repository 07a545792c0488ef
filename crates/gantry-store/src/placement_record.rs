//! The `model_instances.placement` column: one [`PlacementRecord`] as JSON, written by the
//! scheduler (or a placement by hand) and read by everything that shows or runs the
//! instance.
//!
//! A stored record that does not decode (written by another version, or damaged) is never
//! silently treated as absent where that would be unsafe: [`StoredPlacement::Undecodable`]
//! keeps the instance's worker and GPUs in view, so the scheduler keeps those GPUs booked.
//! Every undecodable record is counted ([`undecodable_placement_records`], exported on
//! `/metrics`) and logged once per instance.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use gantry_types::PlacementRecord;

/// What the placement column holds.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredPlacement {
    /// No record: the instance is not placed.
    None,
    /// The record.
    Record(Box<PlacementRecord>),
    /// A record that does not decode, with the reason.
    Undecodable(String),
}

impl StoredPlacement {
    /// The record, when there is one that decodes.
    pub fn record(&self) -> Option<&PlacementRecord> {
        match self {
            StoredPlacement::Record(record) => Some(record),
            StoredPlacement::None | StoredPlacement::Undecodable(_) => None,
        }
    }

    pub fn into_record(self) -> Option<PlacementRecord> {
        match self {
            StoredPlacement::Record(record) => Some(*record),
            StoredPlacement::None | StoredPlacement::Undecodable(_) => None,
        }
    }
}

static UNDECODABLE: AtomicU64 = AtomicU64::new(0);
static LOGGED: Mutex<Option<HashSet<i64>>> = Mutex::new(None);

/// How many times a stored placement record failed to decode since the process started.
pub fn undecodable_placement_records() -> u64 {
    UNDECODABLE.load(Ordering::Relaxed)
}

/// Decodes the column of instance `instance_id`.
pub(crate) fn decode(instance_id: i64, raw: Option<&str>) -> StoredPlacement {
    let Some(raw) = raw else {
        return StoredPlacement::None;
    };
    match serde_json::from_str::<PlacementRecord>(raw) {
        Ok(record) => StoredPlacement::Record(Box::new(record)),
        Err(e) => {
            UNDECODABLE.fetch_add(1, Ordering::Relaxed);
            let first = LOGGED
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .get_or_insert_with(HashSet::new)
                .insert(instance_id);
            if first {
                tracing::error!(
                    instance_id,
                    error = %e,
                    "the stored placement record of this instance cannot be read; its GPUs \
                     stay booked and the scheduler will place it afresh"
                );
            }
            StoredPlacement::Undecodable(e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_that_does_not_decode_is_kept_as_such_and_counted() {
        let before = undecodable_placement_records();
        assert_eq!(decode(1, None), StoredPlacement::None);
        let bad = decode(1, Some(r#"{"claim": 1}"#));
        assert!(matches!(bad, StoredPlacement::Undecodable(_)), "{bad:?}");
        assert!(bad.record().is_none());
        assert!(undecodable_placement_records() > before);
    }
}
