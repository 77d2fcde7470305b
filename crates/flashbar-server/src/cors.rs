//! CORS: off by default (browsers on other origins are refused by their own
//! same-origin rule); with an allow-list, those origins may call the API
//! with the headers OpenAI's SDKs send (authorization, content-type,
//! x-api-key and the x-stainless-* family).

use axum::http::{HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// The x-stainless-* headers OpenAI's JavaScript SDK sends.
const STAINLESS_HEADERS: &[&str] = &[
    "x-stainless-arch",
    "x-stainless-async",
    "x-stainless-custom-poll-interval",
    "x-stainless-helper-method",
    "x-stainless-lang",
    "x-stainless-os",
    "x-stainless-package-version",
    "x-stainless-poll-helper",
    "x-stainless-raw-response",
    "x-stainless-read-timeout",
    "x-stainless-retry-count",
    "x-stainless-runtime",
    "x-stainless-runtime-version",
    "x-stainless-stream-helper",
    "x-stainless-timeout",
];

/// The headers a cross-origin request may carry.
pub fn allowed_headers() -> Vec<HeaderName> {
    [
        "authorization",
        "content-type",
        "x-api-key",
        "openai-organization",
        "openai-project",
    ]
    .iter()
    .chain(STAINLESS_HEADERS)
    .map(|name| HeaderName::from_static(name))
    .collect()
}

/// The layer for an allow-list of origins (`*` allows any); an origin that
/// is not a valid header value is returned as the error.
pub fn layer(origins: &[String]) -> Result<CorsLayer, String> {
    let allow_origin = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let values = origins
            .iter()
            .map(|o| HeaderValue::from_str(o.trim_end_matches('/')).map_err(|_| o.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        AllowOrigin::list(values)
    };
    Ok(CorsLayer::new()
        .allow_origin(allow_origin)
        .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
        .allow_headers(AllowHeaders::list(allowed_headers())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_headers_are_allowed() {
        let names = allowed_headers();
        for name in [
            "authorization",
            "content-type",
            "x-stainless-os",
            "x-stainless-lang",
        ] {
            assert!(names.iter().any(|n| n == name), "{name}");
        }
        assert!(layer(&["http://localhost:5173".into()]).is_ok());
        assert!(layer(&["bad\norigin".into()]).is_err());
    }

    #[tokio::test]
    async fn preflight_allows_listed_origins_only() {
        use crate::routes::{router, AppState};
        use axum::body::Body;
        use axum::http::Request;
        use flashbar_engine::worker::echo::echo_worker;
        use std::sync::Arc;
        use tower::ServiceExt;

        let (state, _cut) = AppState::new(
            Arc::new(echo_worker(1, 0)),
            "echo".into(),
            crate::Limits::default(),
        );
        let app = router(state, Some(Arc::from("key")))
            .layer(layer(&["http://localhost:5173".into()]).unwrap());
        let preflight = |origin: &str| {
            Request::builder()
                .method("OPTIONS")
                .uri("/v1/chat/completions")
                .header("origin", origin)
                .header("access-control-request-method", "POST")
                .header(
                    "access-control-request-headers",
                    "authorization,content-type,x-stainless-os",
                )
                .body(Body::empty())
                .unwrap()
        };
        let allowed = app
            .clone()
            .oneshot(preflight("http://localhost:5173"))
            .await
            .unwrap();
        assert!(allowed.status().is_success(), "{allowed:?}");
        let headers = allowed.headers();
        assert_eq!(
            headers["access-control-allow-origin"],
            "http://localhost:5173"
        );
        let allow = headers["access-control-allow-headers"].to_str().unwrap();
        assert!(allow.contains("authorization") && allow.contains("x-stainless-os"));
        let refused = app.oneshot(preflight("http://evil.example")).await.unwrap();
        assert!(refused
            .headers()
            .get("access-control-allow-origin")
            .is_none());
    }
}
