//! Reading a request body within [`Limits`]: a declared length over the
//! limit is refused before reading (413), a longer body is cut at the limit
//! (413), and a body still incomplete at the deadline is refused (408), so a
//! client that never finishes its body cannot hold a handler forever.

use crate::error::ApiError;
use crate::limits::Limits;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};

/// The whole body, or the JSON error to answer.
pub async fn read(headers: &HeaderMap, body: Body, limits: &Limits) -> Result<Bytes, ApiError> {
    let max = limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large(max));
    }
    match tokio::time::timeout(limits.body_timeout, axum::body::to_bytes(body, max)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(error)) => {
            let source = error.into_inner();
            if source
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                Err(too_large(max))
            } else {
                Err(ApiError::invalid(format!(
                    "cannot read the request body: {source}"
                )))
            }
        }
        Err(_) => Err(ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            code: Some("request_timeout"),
            ..ApiError::invalid(format!(
                "the request body did not arrive within {} s",
                limits.body_timeout.as_secs_f32()
            ))
        }),
    }
}

fn too_large(max: usize) -> ApiError {
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        code: Some("request_too_large"),
        ..ApiError::invalid(format!("the request body is larger than {max} bytes"))
    }
}
