//! The one place where an S3 failure becomes transient (a retry may fix
//! it: throttling, 5xx, timeouts, lost connections) or definite (it will
//! not: credentials, a missing bucket, permissions, a checksum the server
//! refused), with a hint that names what the operator should check.

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use walhook_pipeline::objstore::ObjectStoreError;

/// The one place that decides whether an S3 failure is transient or
/// definite, and what the operator should check when it is definite.
pub(super) fn classify<E>(
    op: &'static str,
    key: &str,
    bucket: &str,
    err: SdkError<E>,
) -> ObjectStoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let credentials = credentials_hint(&err);
    let hint = match &err {
        // No credentials anywhere in the chain, or a broken profile: the
        // SDK reports these as dispatch failures, but no retry finds keys.
        SdkError::DispatchFailure(_) if credentials.is_some() => credentials,
        // Lost connections, refused connections, timeouts: the server may be
        // back on the next try. A request the client itself could not build
        // will not be any better.
        SdkError::DispatchFailure(f) if f.is_user() => Some(
            "the request could not be sent: check [archive.s3] endpoint (a URL such as \
             https://s3.eu-west-1.amazonaws.com)"
                .to_owned(),
        ),
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            None
        }
        SdkError::ConstructionFailure(_) => Some(
            "the request could not be built: check the credentials (AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY, a profile, or [archive.s3] credentials), the region and the \
             endpoint"
                .to_owned(),
        ),
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            service_hint(op, bucket, err.code(), status)
        }
        _ => None,
    };
    ObjectStoreError::backend(op, key, hint, err)
}

/// The hint when the credential chain found no usable credentials (a
/// provider that timed out, such as an unreachable instance role, may
/// answer on a retry and is left transient).
fn credentials_hint(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(c) = e.downcast_ref::<CredentialsError>() {
            return match c {
                CredentialsError::CredentialsNotLoaded(_)
                | CredentialsError::InvalidConfiguration(_) => Some(
                    "no usable S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
                     a profile (AWS_PROFILE), or [archive.s3] credentials"
                        .to_owned(),
                ),
                _ => None,
            };
        }
        next = e.source();
    }
    None
}

/// The hint for a service error that a retry will not fix, or `None` when
/// a retry may.
fn service_hint(op: &str, bucket: &str, code: Option<&str>, status: u16) -> Option<String> {
    let permission = match op {
        "put" => "s3:PutObject",
        "get" => "s3:GetObject",
        "list" => "s3:ListBucket",
        _ => "s3:DeleteObject",
    };
    let hint = match code.unwrap_or("") {
        // Throttling, server trouble and a request the server timed out
        // (S3 sends RequestTimeout as a 400) pass with time.
        "SlowDown"
        | "Throttling"
        | "ThrottlingException"
        | "RequestLimitExceeded"
        | "RequestThrottled"
        | "TooManyRequestsException"
        | "InternalError"
        | "ServiceUnavailable"
        | "RequestTimeout"
        | "ExpiredToken"
        | "NoSuchUpload" => {
            return None;
        }
        "NoSuchBucket" => {
            format!("bucket {bucket} does not exist: create it or fix [archive.s3] bucket")
        }
        "AccessDenied" | "AllAccessDisabled" => format!(
            "access denied to bucket {bucket}: grant these credentials {permission} on the \
             bucket and prefix, or fix the credentials"
        ),
        "InvalidAccessKeyId" | "NotSignedUp" => "the server does not know this access key id: \
             check AWS_ACCESS_KEY_ID (or the profile, or [archive.s3] credentials) and \
             [archive.s3] endpoint"
            .to_owned(),
        "SignatureDoesNotMatch" => "the request signature does not match: check that the \
             secret access key (AWS_SECRET_ACCESS_KEY, the profile, or [archive.s3] credentials) \
             belongs to the access key id, and that no proxy rewrites requests"
            .to_owned(),
        "RequestTimeTooSkewed" => {
            "the server refused the request time: synchronise this machine's clock (NTP)".to_owned()
        }
        "AuthorizationHeaderMalformed"
        | "PermanentRedirect"
        | "IllegalLocationConstraintException" => {
            format!(
                "bucket {bucket} is in another region: set [archive.s3] region to the bucket's region"
            )
        }
        "InvalidBucketName" => {
            format!("{bucket:?} is not a valid bucket name: fix [archive.s3] bucket")
        }
        "BadDigest" | "InvalidDigest" | "XAmzContentSHA256Mismatch" => "the server computed \
             another SHA-256 of the bytes than walhook sent: something between walhook and the \
             server changes request bodies (a proxy?); the object was not stored"
            .to_owned(),
        "EntityTooSmall" => {
            "the server refused a part as too small: raise [archive.s3] part_size".to_owned()
        }
        "EntityTooLarge" => {
            "the object is too large for one upload: lower [archive.s3] multipart_threshold"
                .to_owned()
        }
        _ if status == 429 || status >= 500 => return None,
        code => format!(
            "the server refused the {op} with {} (HTTP {status}): see the error below",
            if code.is_empty() {
                "no error code"
            } else {
                code
            }
        ),
    };
    Some(hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_credentials_are_definite() {
        use aws_sdk_s3::error::ConnectorError;
        use aws_sdk_s3::operation::get_object::GetObjectError;
        let missing = SdkError::<GetObjectError>::dispatch_failure(ConnectorError::other(
            Box::new(CredentialsError::not_loaded(
                "no provider in the chain had any",
            )),
            None,
        ));
        let err = classify("get", "k", "b", missing);
        assert!(!err.is_transient(), "{err:?}");
        assert!(err.to_string().contains("AWS_ACCESS_KEY_ID"), "{err}");
        let refused = SdkError::<GetObjectError>::dispatch_failure(ConnectorError::io(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
        ));
        assert!(classify("get", "k", "b", refused).is_transient());
    }

    #[test]
    fn service_errors_split_into_transient_and_definite() {
        for (code, status) in [
            (Some("SlowDown"), 503),
            (Some("InternalError"), 500),
            (Some("RequestTimeout"), 400),
            (None, 502),
            (Some("Weird"), 429),
        ] {
            assert_eq!(service_hint("put", "b", code, status), None, "{code:?}");
        }
        let hint = service_hint("put", "walhook-archive", Some("NoSuchBucket"), 404).unwrap();
        assert!(hint.contains("walhook-archive does not exist"), "{hint}");
        let hint = service_hint("list", "b", Some("AccessDenied"), 403).unwrap();
        assert!(hint.contains("s3:ListBucket"), "{hint}");
        assert!(service_hint("put", "b", Some("BadDigest"), 400).is_some());
        assert!(service_hint("put", "b", Some("SignatureDoesNotMatch"), 403).is_some());
    }
}
