//! Validation of request bodies after they parsed: syntax of names, ranges of numbers.
//! A failure names the field so the API can answer 422 with a useful message.

use std::fmt;

/// One invalid field of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field's JSON path, such as `replicas` or `source.path`.
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Implemented by request bodies that have rules beyond what their types express.
pub trait Validate {
    fn validate(&self) -> Result<(), FieldError>;
}

/// An optional body (`null`: none) is valid when it is absent or valid.
impl<T: Validate> Validate for Option<T> {
    fn validate(&self) -> Result<(), FieldError> {
        self.as_ref().map_or(Ok(()), Validate::validate)
    }
}

/// The resource-name rule ([`check_name`]) as the spec states it.
pub const NAME_PATTERN: &str = r"^[a-z0-9][a-z0-9._-]*$";

/// A name by the resource-name rule, as the spec shows it where a list holds names (a
/// `Vec<String>` field's schema names this as its items' type).
#[derive(Debug)]
pub struct ResourceName(pub String);

impl utoipa::PartialSchema for ResourceName {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(63))
            .pattern(Some(NAME_PATTERN))
            .into()
    }
}

impl utoipa::ToSchema for ResourceName {}

/// Resource names: 1-63 characters of lowercase ASCII letters, digits, `-`, `_` and
/// `.`, starting with a letter or digit. They appear in URLs, log lines and the
/// OpenAI `model` field, so they are kept plain.
pub fn check_name(field: &str, name: &str) -> Result<(), FieldError> {
    if name.is_empty() || name.len() > 63 {
        return Err(FieldError::new(field, "must be 1 to 63 characters long"));
    }
    let first = name.as_bytes()[0];
    if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
        return Err(FieldError::new(
            field,
            "must start with a lowercase letter or a digit",
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')))
    {
        return Err(FieldError::new(
            field,
            format!(
                "contains {bad:?}; only lowercase letters, digits, '-', '_' and '.' are allowed"
            ),
        ));
    }
    Ok(())
}

/// Usernames follow the resource-name rule.
pub fn check_username(field: &str, name: &str) -> Result<(), FieldError> {
    check_name(field, name)
}

/// Passwords: at least 8 characters, at most 256 (argon2 input stays bounded).
pub fn check_password(field: &str, password: &str) -> Result<(), FieldError> {
    let chars = password.chars().count();
    if chars < 8 {
        return Err(FieldError::new(field, "must be at least 8 characters long"));
    }
    if chars > 256 {
        return Err(FieldError::new(
            field,
            "must be at most 256 characters long",
        ));
    }
    Ok(())
}

/// Labels: keys are 1-63 characters of `[A-Za-z0-9._/-]`, values at most 253 characters
/// without control characters.
pub fn check_labels<'a>(
    field: &str,
    labels: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), FieldError> {
    for (key, value) in labels {
        let key_ok = !key.is_empty()
            && key.len() <= 63
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'));
        if !key_ok {
            return Err(FieldError::new(
                format!("{field}.{key}"),
                "label keys are 1 to 63 characters of letters, digits, '.', '_', '/' and '-'",
            ));
        }
        if value.chars().count() > 253 || value.chars().any(char::is_control) {
            return Err(FieldError::new(
                format!("{field}.{key}"),
                "label values are at most 253 characters without control characters",
            ));
        }
    }
    Ok(())
}

/// The schema of a label map as [`check_labels`] takes it: keys of 1 to 63 letters,
/// digits, `.`, `_`, `/` and `-`; values of at most 253 characters without control
/// characters.
pub fn labels_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(63))
                .pattern(Some(r"^[A-Za-z0-9._/-]*$")),
        ))
        .additional_properties(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(253))
                .pattern(Some(r"^[^\x00-\x1F\x7F-\x9F]*$")),
        ))
        .build()
}

/// What [`check_text`] allows, as a schema pattern: no control characters but newlines
/// and tabs.
pub const TEXT_PATTERN: &str = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$";

/// For `#[serde(default, deserialize_with = "crate::validate::not_null")]`: an optional
/// field that may be left out but not sent as `null`. Its schema says so with
/// `#[schema(nullable = false)]` (an `Option` is nullable in the spec otherwise, and a
/// client generated from it would send the `null` that is refused).
pub fn not_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// Free text (descriptions, full names): bounded length, no control characters except
/// newlines and tabs.
pub fn check_text(field: &str, text: &str, max_chars: usize) -> Result<(), FieldError> {
    if text.chars().count() > max_chars {
        return Err(FieldError::new(
            field,
            format!("must be at most {max_chars} characters long"),
        ));
    }
    if text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(FieldError::new(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's properties of `T`, and whether `T` takes `{field: null}`.
    fn refuses_null<T: utoipa::PartialSchema + serde::de::DeserializeOwned>(
        field: &str,
    ) -> (serde_json::Value, bool) {
        let schema = serde_json::to_value(T::schema()).unwrap_or_default();
        let property = schema["properties"][field].clone();
        let taken = serde_json::from_value::<T>(serde_json::json!({ field: null })).is_ok();
        (property, !taken)
    }

    #[test]
    fn fields_that_refuse_null_are_not_nullable_in_the_spec() {
        use crate::{ApiKeyUpdate, InstancePatch, ModelProviderUpdate, ModelRouteUpdate};
        let cases = [
            (
                "description",
                refuses_null::<ModelRouteUpdate>("description"),
            ),
            ("targets", refuses_null::<ModelRouteUpdate>("targets")),
            (
                "description",
                refuses_null::<ModelProviderUpdate>("description"),
            ),
            ("base_url", refuses_null::<ModelProviderUpdate>("base_url")),
            ("headers", refuses_null::<ModelProviderUpdate>("headers")),
            (
                "timeout_seconds",
                refuses_null::<ModelProviderUpdate>("timeout_seconds"),
            ),
            ("models", refuses_null::<ModelProviderUpdate>("models")),
            ("description", refuses_null::<ApiKeyUpdate>("description")),
            ("gpu_indexes", refuses_null::<InstancePatch>("gpu_indexes")),
        ];
        for (field, (property, refused)) in cases {
            assert!(property.is_object(), "{field}: not in the schema");
            assert!(refused, "{field}: null is taken");
            assert!(
                !property.to_string().contains("\"null\""),
                "{field}: {property}"
            );
        }
        // A list of names states the rule of each name.
        let limits = serde_json::to_value(<crate::ApiKeyLimits as utoipa::PartialSchema>::schema())
            .unwrap_or_default()
            .to_string();
        assert!(limits.contains("ResourceName"), "{limits}");
        let name = serde_json::to_value(<ResourceName as utoipa::PartialSchema>::schema())
            .unwrap_or_default();
        assert_eq!(name["pattern"], NAME_PATTERN, "{name}");
        assert_eq!(name["maxLength"], 63, "{name}");
        // A field whose `null` means something stays nullable: a provider's `api_key`
        // (null removes it).
        let (property, refused) = refuses_null::<ModelProviderUpdate>("api_key");
        assert!(
            !refused && property.to_string().contains("\"null\""),
            "{property}"
        );
    }

    #[test]
    fn names_accept_plain_identifiers() {
        for ok in ["a", "llama-3.1-8b", "qwen2_7b", "0model"] {
            assert!(check_name("name", ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn names_reject_uppercase_spaces_and_length() {
        assert!(check_name("name", "").is_err());
        assert!(check_name("name", "Llama").is_err());
        assert!(check_name("name", "a b").is_err());
        assert!(check_name("name", "-a").is_err());
        assert!(check_name("name", &"a".repeat(64)).is_err());
        let err = check_name("name", "a/b").unwrap_err();
        assert_eq!(err.field, "name");
        assert!(err.message.contains("'/'"), "{}", err.message);
    }

    #[test]
    fn passwords_have_bounds() {
        assert!(check_password("password", "short").is_err());
        assert!(check_password("password", "long enough").is_ok());
        assert!(check_password("password", &"x".repeat(257)).is_err());
    }
}
