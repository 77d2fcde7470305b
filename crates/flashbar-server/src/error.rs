//! Errors as OpenAI error objects: every failure answers
//! `{"error": {"message", "type", "param", "code"}}` with its HTTP status,
//! never plain text.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashbar_engine::EngineError;
use serde::Serialize;

/// One failed request, ready to be answered.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 400: malformed JSON or a value out of range.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending request field.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_owned()),
            code: Some("invalid_value"),
            ..Self::invalid(message)
        }
    }

    /// 401: the API key is missing or wrong.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        ApiError {
            code: Some("invalid_api_key"),
            ..Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message)
        }
    }

    /// 404: no such model.
    pub fn model_not_found(model: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model `{model}` does not exist"),
            )
        }
    }

    /// 404: no such route.
    pub fn route_not_found(method: &str, path: &str) -> Self {
        ApiError {
            code: Some("not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("no route for {method} {path}"),
            )
        }
    }

    /// 405: the route exists, not with this method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        ApiError {
            code: Some("method_not_allowed"),
            ..Self::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("{path} does not take {method}"),
            )
        }
    }

    /// 429: the generation queue is full.
    pub fn queue_full(capacity: usize) -> Self {
        ApiError {
            code: Some("rate_limit_exceeded"),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("the server is busy ({capacity} requests queued); retry later"),
            )
        }
    }

    /// 503: the server is shutting down.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            code: Some("server_shutting_down"),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    /// 500: the engine failed.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            code: Some("internal_error"),
            ..Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
        }
    }

    /// The JSON error object.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or_default()
    }
}

/// The engine's errors as the API answers them: a bad request 400 (naming
/// its field when the engine does), a full queue 429, the rest 500.
impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::InvalidRequest(message) => ApiError::invalid(message),
            EngineError::InvalidParam { param, message } => ApiError::invalid_param(param, message),
            EngineError::QueueFull { capacity } => ApiError::queue_full(capacity),
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_object_has_all_four_fields() {
        let body = ApiError::invalid("bad").body();
        assert_eq!(
            body,
            serde_json::json!({"error": {"message": "bad", "type": "invalid_request_error",
                "param": null, "code": null}})
        );
    }

    #[test]
    fn statuses_and_codes() {
        let e = ApiError::model_not_found("x");
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(e.body()["error"]["code"], "model_not_found");
        assert_eq!(e.body()["error"]["param"], "model");
        let e = ApiError::queue_full(64);
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.body()["error"]["type"], "rate_limit_error");
        assert_eq!(
            ApiError::unauthorized("no").status,
            StatusCode::UNAUTHORIZED
        );
    }

    #[test]
    fn engine_errors_map_to_400_and_500() {
        let e: ApiError = EngineError::InvalidRequest("too long".into()).into();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e: ApiError = EngineError::Tokenizer("broken".into()).into();
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(e.body()["error"]["type"], "server_error");
        let e: ApiError = EngineError::InvalidParam {
            param: "speculation",
            message: "no drafter".into(),
        }
        .into();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            (e.param.as_deref(), e.message.as_str()),
            (Some("speculation"), "no drafter")
        );
        let e: ApiError = EngineError::QueueFull { capacity: 3 }.into();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        let e: ApiError = EngineError::Panicked.into();
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
}
