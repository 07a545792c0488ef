//! The queries of the list endpoints (`?page=&per_page=&watch=` and each list's filters),
//! and the filters themselves.
//!
//! A filter is a list of [`Condition`]s on named columns. The store turns them into the
//! `WHERE` of its SQL; a watch stream applies [`ListFilter::matches`], which evaluates the
//! very same conditions on an object ([`ListFilter::column`] gives an object's value of a
//! column). So a list and its watch cannot disagree on what a filter means; a store test
//! checks both readings on SQLite and PostgreSQL.

use serde::{Deserialize, Serialize};
use utoipa::IntoParams;

use crate::api_key::ApiKey;
use crate::instance::{InstanceState, ModelInstance};
use crate::model::Model;
use crate::user::{Role, User};
use crate::validate::{FieldError, Validate};
use crate::worker::{Worker, WorkerState};

/// Largest page a list returns.
pub const MAX_PER_PAGE: u32 = 1000;
/// Page size when the client does not say.
pub const DEFAULT_PER_PAGE: u32 = 100;

/// A value a condition compares with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Int(i64),
    Text(&'a str),
}

/// One condition of a filter; a filter holds when all its conditions do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition<'a> {
    /// The column equals the value.
    Equals {
        column: &'static str,
        value: Value<'a>,
    },
    /// The column's text contains `text`, ignoring ASCII case.
    Contains { column: &'static str, text: &'a str },
    /// The column is one of the integers (none: nothing matches).
    OneOf {
        column: &'static str,
        values: &'a [i64],
    },
}

impl Condition<'_> {
    /// Whether the condition holds for an object whose column values `column` gives.
    pub fn holds<'v>(&self, column: impl Fn(&str) -> Option<Value<'v>>) -> bool {
        match *self {
            Condition::Equals {
                column: name,
                value,
            } => column(name) == Some(value),
            Condition::Contains { column: name, text } => match column(name) {
                Some(Value::Text(have)) => have
                    .to_ascii_lowercase()
                    .contains(&text.to_ascii_lowercase()),
                _ => false,
            },
            Condition::OneOf {
                column: name,
                values,
            } => match column(name) {
                Some(Value::Int(have)) => values.contains(&have),
                _ => false,
            },
        }
    }
}

/// The filter of one list.
pub trait ListFilter {
    /// What the list holds.
    type Item;

    /// The conditions, all of which must hold.
    fn conditions(&self) -> Vec<Condition<'_>>;

    /// An item's value of a column the conditions name; `None` for a column it has not
    /// (or a null).
    fn column<'i>(item: &'i Self::Item, column: &str) -> Option<Value<'i>>;

    /// Whether `item` passes the filter: the same conditions the store's SQL applies.
    fn matches(&self, item: &Self::Item) -> bool {
        self.conditions()
            .iter()
            .all(|condition| condition.holds(|column| Self::column(item, column)))
    }
}

/// A list query: paging, watching, and the filter it stands for.
pub trait ListQuery {
    type Filter: ListFilter;

    /// The filter part of the query.
    fn filter(&self) -> Self::Filter;
    /// `page` and `per_page` as asked.
    fn paging(&self) -> (Option<u32>, Option<u32>);
    /// Whether the list is to be watched rather than read once.
    fn watch(&self) -> bool;
    /// How long a watch stream lasts before the server ends it; `None`: until the client
    /// goes away.
    fn watch_timeout(&self) -> Option<std::time::Duration>;
}

/// The longest `timeout_seconds` a watch or a log follow takes: a day.
pub const MAX_STREAM_TIMEOUT_SECONDS: u32 = 86_400;

/// `timeout_seconds` of a watch or a log follow: 1 to [`MAX_STREAM_TIMEOUT_SECONDS`].
pub fn check_stream_timeout(timeout_seconds: Option<u32>) -> Result<(), FieldError> {
    if timeout_seconds.is_some_and(|s| !(1..=MAX_STREAM_TIMEOUT_SECONDS).contains(&s)) {
        return Err(FieldError::new(
            "timeout_seconds",
            format!("must be between 1 and {MAX_STREAM_TIMEOUT_SECONDS}"),
        ));
    }
    Ok(())
}

/// Paging and watching, common to every list query.
fn check_page(page: Option<u32>, per_page: Option<u32>) -> Result<(), FieldError> {
    if page == Some(0) {
        return Err(FieldError::new("page", "pages are numbered from 1"));
    }
    if let Some(per_page) = per_page {
        if !(1..=MAX_PER_PAGE).contains(&per_page) {
            return Err(FieldError::new(
                "per_page",
                format!("must be between 1 and {MAX_PER_PAGE}"),
            ));
        }
    }
    Ok(())
}

/// Declares a list query: its filter fields, then `page`, `per_page` and `watch`, with the
/// filter it stands for.
macro_rules! list_query {
    (
        $(#[$meta:meta])*
        $query:ident => $filter:ident {
            $( $(#[doc = $doc:literal])* $field:ident : $ty:ty $(as $schema:ty)?, )*
        }
        $( scope {
            $( $(#[doc = $sdoc:literal])* $sfield:ident : $sty:ty, )*
        } )?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, IntoParams)]
        #[serde(deny_unknown_fields)]
        #[into_params(parameter_in = Query)]
        pub struct $query {
            $(
                $(#[doc = $doc])*
                $(#[param(value_type = Option<$schema>)])?
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $field: Option<$ty>,
            )*
            /// 1-based page number (default 1).
            #[param(value_type = Option<i64>, minimum = 1, maximum = 4294967295_i64)]
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub page: Option<u32>,
            /// Items per page, 1 to 1000 (default 100).
            #[param(value_type = Option<i64>, minimum = 1, maximum = 1000)]
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub per_page: Option<u32>,
            /// Stream the list and its changes as NDJSON watch events instead of one page.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub watch: Option<bool>,
            /// With `watch=true`: end the stream after this many seconds (1 to 86400);
            /// without it the stream lasts until the client goes away.
            #[param(minimum = 1, maximum = 86400)]
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub timeout_seconds: Option<u32>,
        }

        #[doc = concat!("The filter of [`", stringify!($query), "`].")]
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct $filter {
            $( $(#[doc = $doc])* pub $field: Option<$ty>, )*
            $($( $(#[doc = $sdoc])* pub $sfield: Option<$sty>, )*)?
        }

        impl ListQuery for $query {
            type Filter = $filter;

            fn filter(&self) -> $filter {
                $filter {
                    $( $field: self.$field.clone(), )*
                    $($( $sfield: None, )*)?
                }
            }

            fn paging(&self) -> (Option<u32>, Option<u32>) {
                (self.page, self.per_page)
            }

            fn watch(&self) -> bool {
                self.watch == Some(true)
            }

            fn watch_timeout(&self) -> Option<std::time::Duration> {
                self.timeout_seconds
                    .map(|s| std::time::Duration::from_secs(u64::from(s)))
            }
        }

        impl Validate for $query {
            fn validate(&self) -> Result<(), FieldError> {
                check_page(self.page, self.per_page)?;
                check_stream_timeout(self.timeout_seconds)
            }
        }
    };
}

/// A list's cluster conditions: the one the query names, and the ones the caller may see.
fn cluster_conditions<'a>(
    conditions: &mut Vec<Condition<'a>>,
    cluster_id: Option<i64>,
    within: &'a Option<Vec<i64>>,
) {
    if let Some(cluster_id) = cluster_id {
        conditions.push(Condition::Equals {
            column: "cluster_id",
            value: Value::Int(cluster_id),
        });
    }
    if let Some(values) = within {
        conditions.push(Condition::OneOf {
            column: "cluster_id",
            values,
        });
    }
}

list_query! {
    /// `GET /api/v1/models`.
    ModelQuery => ModelFilter {
        /// Exactly this name.
        name: String,
        backend: String,
        /// Part of the name, any case.
        search: String,
        /// Models deployed into this cluster.
        cluster_id: i64,
    }
    scope {
        /// Set by the server, never by the query: the clusters the caller may see.
        within_clusters: Vec<i64>,
    }
}

impl ListFilter for ModelFilter {
    type Item = Model;

    fn conditions(&self) -> Vec<Condition<'_>> {
        let mut conditions = Vec::new();
        if let Some(name) = &self.name {
            conditions.push(Condition::Equals {
                column: "name",
                value: Value::Text(name),
            });
        }
        if let Some(backend) = &self.backend {
            conditions.push(Condition::Equals {
                column: "backend",
                value: Value::Text(backend),
            });
        }
        if let Some(search) = &self.search {
            conditions.push(Condition::Contains {
                column: "name",
                text: search,
            });
        }
        cluster_conditions(&mut conditions, self.cluster_id, &self.within_clusters);
        conditions
    }

    fn column<'i>(item: &'i Model, column: &str) -> Option<Value<'i>> {
        match column {
            "name" => Some(Value::Text(&item.name)),
            "backend" => Some(Value::Text(item.backend.as_str())),
            "cluster_id" => Some(Value::Int(item.cluster_id)),
            _ => None,
        }
    }
}

list_query! {
    /// `GET /api/v1/model-instances`.
    InstanceQuery => InstanceFilter {
        model_id: i64,
        worker_id: i64,
        state: InstanceState,
        /// Instances of models deployed into this cluster.
        cluster_id: i64,
    }
    scope {
        /// Set by the server, never by the query: the clusters the caller may see.
        within_clusters: Vec<i64>,
    }
}

impl ListFilter for InstanceFilter {
    type Item = ModelInstance;

    fn conditions(&self) -> Vec<Condition<'_>> {
        let mut conditions = Vec::new();
        if let Some(model_id) = self.model_id {
            conditions.push(Condition::Equals {
                column: "model_id",
                value: Value::Int(model_id),
            });
        }
        if let Some(worker_id) = self.worker_id {
            conditions.push(Condition::Equals {
                column: "worker_id",
                value: Value::Int(worker_id),
            });
        }
        if let Some(state) = self.state {
            conditions.push(Condition::Equals {
                column: "state",
                value: Value::Text(state.as_str()),
            });
        }
        cluster_conditions(&mut conditions, self.cluster_id, &self.within_clusters);
        conditions
    }

    fn column<'i>(item: &'i ModelInstance, column: &str) -> Option<Value<'i>> {
        match column {
            "model_id" => Some(Value::Int(item.model_id)),
            "cluster_id" => Some(Value::Int(item.cluster_id)),
            "worker_id" => item.worker_id.map(Value::Int),
            "state" => Some(Value::Text(item.state.as_str())),
            _ => None,
        }
    }
}

list_query! {
    /// `GET /api/v1/workers`.
    WorkerQuery => WorkerFilter {
        state: WorkerState,
        /// Exactly this name.
        name: String,
        /// Workers of this cluster.
        cluster_id: i64,
    }
    scope {
        /// Set by the server, never by the query: the clusters the caller may see.
        within_clusters: Vec<i64>,
    }
}

impl ListFilter for WorkerFilter {
    type Item = Worker;

    fn conditions(&self) -> Vec<Condition<'_>> {
        let mut conditions = Vec::new();
        if let Some(state) = self.state {
            conditions.push(Condition::Equals {
                column: "state",
                value: Value::Text(state.as_str()),
            });
        }
        if let Some(name) = &self.name {
            conditions.push(Condition::Equals {
                column: "name",
                value: Value::Text(name),
            });
        }
        cluster_conditions(&mut conditions, self.cluster_id, &self.within_clusters);
        conditions
    }

    fn column<'i>(item: &'i Worker, column: &str) -> Option<Value<'i>> {
        match column {
            "state" => Some(Value::Text(item.state.as_str())),
            "name" => Some(Value::Text(&item.name)),
            "cluster_id" => Some(Value::Int(item.cluster_id)),
            _ => None,
        }
    }
}

list_query! {
    /// `GET /api/v1/users`.
    UserQuery => UserFilter {
        role: Role,
        /// Part of the username, any case.
        search: String,
    }
}

impl ListFilter for UserFilter {
    type Item = User;

    fn conditions(&self) -> Vec<Condition<'_>> {
        let mut conditions = Vec::new();
        if let Some(role) = self.role {
            conditions.push(Condition::Equals {
                column: "role",
                value: Value::Text(role.as_str()),
            });
        }
        if let Some(search) = &self.search {
            conditions.push(Condition::Contains {
                column: "username",
                text: search,
            });
        }
        conditions
    }

    fn column<'i>(item: &'i User, column: &str) -> Option<Value<'i>> {
        match column {
            "role" => Some(Value::Text(item.role.as_str())),
            "username" => Some(Value::Text(&item.username)),
            _ => None,
        }
    }
}

list_query! {
    /// `GET /api/v1/api-keys`.
    ApiKeyQuery => ApiKeyFilter {
        /// Admins only: keys of this user (default: every user's for admins, your own for
        /// everyone else).
        user_id: i64,
    }
}

impl ListFilter for ApiKeyFilter {
    type Item = ApiKey;

    fn conditions(&self) -> Vec<Condition<'_>> {
        self.user_id
            .map(|user_id| Condition::Equals {
                column: "user_id",
                value: Value::Int(user_id),
            })
            .into_iter()
            .collect()
    }

    fn column<'i>(item: &'i ApiKey, column: &str) -> Option<Value<'i>> {
        match column {
            "user_id" => Some(Value::Int(item.user_id)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_ignores_ascii_case_and_equals_is_exact() {
        let text = |v: &'static str| move |_: &str| Some(Value::Text(v));
        let contains = Condition::Contains {
            column: "name",
            text: "Lama",
        };
        assert!(contains.holds(text("tiny-llama")));
        assert!(!contains.holds(text("qwen")));
        assert!(!contains.holds(|_: &str| None));
        let equals = Condition::Equals {
            column: "name",
            value: Value::Text("tiny"),
        };
        assert!(equals.holds(text("tiny")));
        assert!(!equals.holds(text("Tiny")));
    }

    #[test]
    fn queries_check_paging_and_keep_their_filter() {
        use super::ListQuery;
        let query: InstanceQuery =
            serde_json::from_str(r#"{"model_id": 3, "state": "running", "per_page": 10}"#)
                .expect("decodable");
        assert!(query.validate().is_ok());
        assert_eq!(
            query.filter(),
            InstanceFilter {
                model_id: Some(3),
                worker_id: None,
                state: Some(InstanceState::Running),
                ..InstanceFilter::default()
            }
        );
        let bad = InstanceQuery {
            per_page: Some(5000),
            ..InstanceQuery::default()
        };
        assert_eq!(bad.validate().expect_err("too many").field, "per_page");
        assert!(serde_json::from_str::<ModelQuery>(r#"{"colour": "red"}"#).is_err());
        assert!(
            serde_json::from_str::<ModelQuery>(r#"{"within_clusters": [1]}"#).is_err(),
            "the caller's clusters are the server's to set, never the query's"
        );
    }

    #[test]
    fn a_scope_of_clusters_lets_through_only_what_is_in_them() {
        use crate::fixtures;
        let mut worker = fixtures::worker(1, 0);
        worker.cluster_id = 2;
        let mut filter = WorkerFilter::default();
        assert!(filter.matches(&worker));
        filter.within_clusters = Some(vec![1, 2]);
        assert!(filter.matches(&worker));
        filter.within_clusters = Some(vec![1]);
        assert!(!filter.matches(&worker));
        filter.within_clusters = Some(Vec::new());
        assert!(!filter.matches(&worker), "no clusters: nothing");
        filter.within_clusters = None;
        filter.cluster_id = Some(2);
        assert!(filter.matches(&worker));
    }
}
