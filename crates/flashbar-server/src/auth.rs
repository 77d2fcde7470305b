//! The optional API key: when set, every `/v1` request must present it as
//! `Authorization: Bearer KEY` or `x-api-key: KEY` (401 otherwise). With no
//! key set, any key (SDKs always send one) or none is accepted.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The key a request presents, if any.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(value) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
        let value = value.trim();
        if value.len() > 7 && value[..7].eq_ignore_ascii_case("bearer ") {
            return Some(value[7..].trim());
        }
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// Compares in constant time (`subtle`), so the time taken does not say
/// where the first wrong byte is. Only the key's length can be learnt.
fn same_key(given: &str, expected: &str) -> bool {
    given.as_bytes().ct_eq(expected.as_bytes()).into()
}

/// Whether `headers` carry the right key; the 401 to answer if not.
pub fn check(headers: &HeaderMap, expected: &str) -> Result<(), ApiError> {
    match presented_key(headers) {
        Some(key) if same_key(key, expected) => Ok(()),
        Some(_) => Err(ApiError::unauthorized("Incorrect API key provided.")),
        None => Err(ApiError::unauthorized(
            "Missing API key: send it as `Authorization: Bearer KEY` or `x-api-key: KEY`.",
        )),
    }
}

/// Middleware refusing requests without the key.
pub async fn require_key(
    State(expected): State<Arc<str>>,
    request: Request,
    next: Next,
) -> Response {
    match check(request.headers(), &expected) {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, v.parse().unwrap());
        }
        map
    }

    #[test]
    fn bearer_or_x_api_key() {
        assert_eq!(
            presented_key(&headers(&[("authorization", "Bearer sk-1")])),
            Some("sk-1")
        );
        assert_eq!(
            presented_key(&headers(&[("authorization", "bearer sk-1")])),
            Some("sk-1")
        );
        assert_eq!(presented_key(&headers(&[("x-api-key", "k")])), Some("k"));
        assert_eq!(presented_key(&headers(&[])), None);
    }

    #[test]
    fn wrong_or_missing_keys_are_401() {
        assert!(check(&headers(&[("authorization", "Bearer right")]), "right").is_ok());
        let wrong = check(&headers(&[("x-api-key", "wrong")]), "right").unwrap_err();
        assert_eq!(wrong.status.as_u16(), 401);
        assert_eq!(wrong.body()["error"]["code"], "invalid_api_key");
        assert_eq!(
            check(&headers(&[]), "right").unwrap_err().status.as_u16(),
            401
        );
        assert!(check(&headers(&[("x-api-key", "righ")]), "right").is_err());
        assert!(check(&headers(&[("x-api-key", "rightt")]), "right").is_err());
        assert!(check(&headers(&[("x-api-key", "")]), "right").is_err());
        assert!(same_key("right", "right"));
        assert!(!same_key("Right", "right"));
    }
}
