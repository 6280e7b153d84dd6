//! Whether a component can ship in the `tidegate-plugins` ConfigMap
//! (deploy/README.md, "Ship and swap a policy of your own").
//!
//! The API server refuses a ConfigMap whose `data` and `binaryData` values
//! total more than 1 MiB (1,048,576 bytes, counted decoded: base64 on the
//! wire costs nothing; the keys are not counted). The deployment's
//! `tidegate-plugins` ConfigMap holds nothing but the operator's plugins, so
//! a component gets the whole MiB and no margin is taken for other content:
//! the only other content is other plugins, whose sizes add up against the
//! same limit. A dev-profile build (5-6 MB) never fits; a release build of
//! the SDK's skeleton is about 126 KB.

/// The most a ConfigMap's values may total (the API server's `MaxSecretSize`).
pub const CONFIGMAP_MAX_BYTES: usize = 1 << 20;

/// The most `kubectl apply` without `--server-side` ships: it stores the
/// whole object, binaryData in base64 (4 bytes per 3), in the
/// `last-applied-configuration` annotation, and an object's annotations
/// total at most 256 KiB. 190 KiB of component leaves about 3 KiB of it for
/// the rest of the object.
pub const CLIENT_SIDE_APPLY_MAX_BYTES: usize = 190 << 10;

/// A component the ConfigMap cannot hold.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{size} bytes is too large for the tidegate-plugins ConfigMap, which holds at most \
     {CONFIGMAP_MAX_BYTES} bytes (1 MiB, the API server's limit on a ConfigMap's data)"
)]
pub struct TooLarge {
    pub size: usize,
}

/// `Ok` when a component of `size` bytes fits the ConfigMap; `Ok(Some(note))`
/// when it fits only with `kubectl apply --server-side`.
pub fn fits(size: usize) -> Result<Option<String>, TooLarge> {
    if size > CONFIGMAP_MAX_BYTES {
        return Err(TooLarge { size });
    }
    Ok((size > CLIENT_SIDE_APPLY_MAX_BYTES).then(|| {
        format!(
            "fits the tidegate-plugins ConfigMap only with `kubectl apply --server-side`: \
             client-side apply copies it, base64, into an annotation of at most 256 KiB \
             ({CLIENT_SIDE_APPLY_MAX_BYTES} bytes of component)"
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_component_over_one_mib_is_refused_naming_size_and_limit() {
        assert_eq!(fits(126_000), Ok(None));
        assert_eq!(fits(CLIENT_SIDE_APPLY_MAX_BYTES), Ok(None));
        let note = fits(CLIENT_SIDE_APPLY_MAX_BYTES + 1).unwrap().unwrap();
        assert!(note.contains("--server-side"), "{note}");
        assert!(
            fits(CONFIGMAP_MAX_BYTES).is_ok(),
            "exactly 1 MiB is accepted"
        );
        let e = fits(5_812_345).unwrap_err();
        assert_eq!(e, TooLarge { size: 5_812_345 });
        let e = e.to_string();
        assert!(
            e.starts_with("5812345 bytes is too large for the tidegate-plugins ConfigMap")
                && e.contains("at most 1048576 bytes"),
            "{e}"
        );
        assert!(fits(CONFIGMAP_MAX_BYTES + 1).is_err());
    }
}
