//! Who is calling: the caller behind a request's bearer token or session cookie, through
//! the shared authenticator, and the per-connection memo that lets a keep-alive
//! connection's requests with the same API key skip the lookup while its grant holds.

use axum::http::header::{self, HeaderMap};
use axum::http::StatusCode;
use gantry_auth::cache::Grant;
use gantry_auth::Principal;
use tokio::time::Instant;

use crate::error::OpenAiError;
use crate::usage::Caller;
use crate::Gateway;

/// The request's bearer token, else its session cookie (the web console's playground calls
/// the gateway with the session it signed in with; the cookie is `SameSite=Lax`, so no
/// other site's page can send it with a POST).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        return gantry_types::auth::bearer_token(value.to_str().ok()?);
    }
    gantry_types::auth::session_cookie(
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok()),
    )
}

/// The caller behind a request's bearer token: a person (API key or session), resolved
/// by the shared authenticator (API keys from its cache).
pub async fn authenticate(gateway: &Gateway, headers: &HeaderMap) -> Result<Caller, OpenAiError> {
    authenticate_token(gateway, bearer(headers)).await
}

/// The caller behind a bearer token (or session cookie token) already taken from the
/// request.
pub async fn authenticate_token(
    gateway: &Gateway,
    token: Option<&str>,
) -> Result<Caller, OpenAiError> {
    let token = token.ok_or_else(OpenAiError::missing_api_key)?;
    caller_of(gateway.authenticator.authenticate(token).await?)
}

/// The caller a principal may call the gateway as.
fn caller_of(principal: Principal) -> Result<Caller, OpenAiError> {
    match principal {
        Principal::User {
            user,
            api_key_id: Some(api_key_id),
        } => Ok(Caller {
            user_id: user.id,
            api_key_id: Some(api_key_id),
        }),
        Principal::User {
            user,
            api_key_id: None,
        } => {
            if user.require_password_change {
                return Err(OpenAiError::new(
                    StatusCode::FORBIDDEN,
                    "permission_error",
                    "password_change_required",
                    "change your password first: POST /auth/change-password",
                ));
            }
            Ok(Caller {
                user_id: user.id,
                api_key_id: None,
            })
        }
        Principal::Worker { .. } | Principal::Server { .. } => Err(OpenAiError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            "forbidden",
            "worker and server credentials cannot call the gateway; use an API key",
        )),
    }
}

/// The caller of a connection's last API key, kept for its next requests with the same
/// key while the authenticator's [`Grant`] holds: a keep-alive connection's requests
/// then skip the key's digest, the cache's lock and its lookup.
#[derive(Debug, Default)]
pub struct KeyMemo {
    token: Vec<u8>,
    held: Option<(Caller, Grant)>,
}

impl KeyMemo {
    /// The caller of `token` if it is the kept key and its grant still holds.
    fn caller(&self, gateway: &Gateway, token: &str, now: Instant) -> Option<Caller> {
        let (caller, grant) = self.held.as_ref()?;
        (same_secret(&self.token, token.as_bytes())
            && gateway.authenticator.grant_holds(grant, now))
        .then(|| caller.clone())
    }

    fn keep(&mut self, token: &str, caller: &Caller, grant: Option<Grant>) {
        match grant {
            Some(grant) => {
                self.token.clear();
                self.token.extend_from_slice(token.as_bytes());
                self.held = Some((caller.clone(), grant));
            }
            None => self.held = None,
        }
    }
}

/// Whether two secrets are equal, in a time that does not depend on where they
/// differ (one connection may carry several clients' requests, through a proxy).
///
/// Every byte pair is folded into one difference with no branch on it, and the fold is
/// hidden from the optimiser only once at the end (`black_box`) rather than per byte,
/// since this runs on every keep-alive request. A length difference is not secret (keys
/// have one format).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// The caller behind a token, from `memo` when it holds the token's grant; else asked
/// of the authenticator, and the grant kept.
pub(super) async fn authenticate_kept(
    gateway: &Gateway,
    token: Option<&str>,
    memo: &mut KeyMemo,
    now: Instant,
) -> Result<Caller, OpenAiError> {
    let token = token.ok_or_else(OpenAiError::missing_api_key)?;
    if let Some(caller) = memo.caller(gateway, token, now) {
        return Ok(caller);
    }
    let (principal, grant) = gateway.authenticator.authenticate_granted(token).await?;
    let caller = caller_of(principal)?;
    memo.keep(token, &caller, grant);
    Ok(caller)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_the_same_only_when_every_byte_is() {
        let key = b"gantry_0123456789abcdef0123456789abcdef0123456789ab";
        assert!(same_secret(key, key));
        let mut other = *key;
        for at in [0, 25, key.len() - 1] {
            other[at] ^= 1;
            assert!(!same_secret(key, &other), "differs at {at}");
            other[at] ^= 1;
        }
        assert!(!same_secret(key, &key[..key.len() - 1]));
        assert!(same_secret(b"", b""));
    }
}
