//! Request extractors that turn axum's rejections into [`ApiError`]s, so malformed
//! JSON, unknown fields, wrong types, bad query strings and oversized bodies all
//! answer in the one error shape with a message that names the problem.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use gantry_types::{ErrorCode, Validate};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON body, deserialised and then validated.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned + Validate,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let axum::Json(value) = axum::Json::<T>::from_request(req, state)
            .await
            .map_err(json_rejection)?;
        value.validate()?;
        Ok(Self(value))
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    let status = rejection.status();
    let detail = rejection.body_text();
    match rejection {
        JsonRejection::JsonDataError(_) => ApiError::validation(detail.replace(
            "Failed to deserialize the JSON body into the target type: ",
            "",
        )),
        JsonRejection::JsonSyntaxError(_) => ApiError::bad_request(format!(
            "request body is not valid JSON: {}",
            detail.replace("Failed to parse the request body as JSON: ", "")
        )),
        JsonRejection::MissingJsonContentType(_) => ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "send the body as JSON with Content-Type: application/json",
        ),
        _ if status == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            ErrorCode::PayloadTooLarge,
            "request body is larger than the server's limit (max_request_body)",
        ),
        _ => ApiError::bad_request(detail),
    }
}

/// A query string, deserialised and validated.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned + Validate,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(value) =
            axum::extract::Query::<T>::from_request_parts(parts, state)
                .await
                .map_err(|rejection: QueryRejection| {
                    ApiError::bad_request(rejection.body_text().replace(
                        "Failed to deserialize query string: ",
                        "invalid query string: ",
                    ))
                })?;
        value
            .validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        Ok(Self(value))
    }
}

/// A path parameter.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(value) = axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map_err(|rejection: PathRejection| {
                ApiError::bad_request(format!(
                    "invalid path parameter: {}; ids are positive integers",
                    rejection.body_text()
                ))
            })?;
        Ok(Self(value))
    }
}

/// The client's IP address, from its connection (`None` for a request that did not come
/// through the server's accept loop, such as a test calling the router directly).
#[derive(Debug, Clone, Copy)]
pub struct ClientAddress(pub Option<std::net::IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for ClientAddress {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(
            parts
                .extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|info| info.0.ip().to_canonical()),
        ))
    }
}
