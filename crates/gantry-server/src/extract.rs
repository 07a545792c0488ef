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
///
/// A number with no fraction is an integer whatever its spelling (`248.0` is `248`, as
/// JSON Schema has it), so clients that write every number as a float are understood.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

/// `248.0` → `248`, anywhere in the value: a float with no fraction that an integer type
/// holds.
fn integral_floats_as_integers(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Number(number) if number.is_f64() => {
            let Some(float) = number.as_f64() else {
                return;
            };
            if float.fract() != 0.0 || !float.is_finite() {
                return;
            }
            // `as` saturates; a value that does not come back unchanged did not fit.
            if float < 0.0 && (float as i64) as f64 == float {
                *value = Value::from(float as i64);
            } else if float >= 0.0 && (float as u64) as f64 == float {
                *value = Value::from(float as u64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_floats_as_integers),
        Value::Object(fields) => fields.values_mut().for_each(integral_floats_as_integers),
        _ => {}
    }
}

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned + Validate,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let axum::Json(mut json) = axum::Json::<serde_json::Value>::from_request(req, state)
            .await
            .map_err(json_rejection)?;
        integral_floats_as_integers(&mut json);
        let value: T = serde_path_to_error::deserialize(json)
            .map_err(|e| ApiError::validation(e.to_string()))?;
        value.validate()?;
        Ok(Self(value))
    }
}

/// [`ApiJson`] for a body that may be left out: a request without a body (no
/// `Content-Type`, no or zero `Content-Length`) is `None`, and so is a JSON `null`.
#[derive(Debug)]
pub struct OptionalApiJson<T>(pub Option<T>);

impl<T, S> FromRequest<S> for OptionalApiJson<T>
where
    T: DeserializeOwned + Validate,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let headers = req.headers();
        let no_body = headers.get(axum::http::header::CONTENT_TYPE).is_none()
            && headers
                .get(axum::http::header::CONTENT_LENGTH)
                .is_none_or(|length| length.as_bytes() == b"0");
        if no_body {
            return Ok(Self(None));
        }
        let ApiJson(value) = ApiJson::<Option<T>>::from_request(req, state).await?;
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::integral_floats_as_integers;

    #[test]
    fn integral_floats_become_integers_and_the_rest_stay() {
        let mut value = json!({
            "days": 248.0, "load": {"inflight": 4_677_666_124.0_f64, "negative": -3.0},
            "list": [1.0, 1.5], "huge": 1e300, "text": "2.0", "int": 7
        });
        integral_floats_as_integers(&mut value);
        assert_eq!(
            value,
            json!({
                "days": 248, "load": {"inflight": 4_677_666_124_u64, "negative": -3},
                "list": [1, 1.5], "huge": 1e300, "text": "2.0", "int": 7
            })
        );
        assert!(value["days"].is_u64());
    }
}
