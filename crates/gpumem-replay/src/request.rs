//! The values a replay is asked for by name — which policies, on what capacity, with which
//! allocator settings — parsed the same way for the command line and the Python package.

use gpumem_device::sim::MAX_CAPACITY;
use gpumem_pool::policies::torch_settings::TorchSettings;
use gpumem_pool::policies::GpumemSettings;
use gpumem_pool::{parse_limit, Limit, PolicyKind, ACCEPTED_BYTE_FORMS};

/// A value of a replay request that is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?}: {reason}")]
pub struct RequestError {
    /// What the value is for (`policy`, `capacity`, `pytorch_alloc_conf`, …).
    pub what: &'static str,
    /// The value as given.
    pub value: String,
    /// Why it is refused and what is accepted.
    pub reason: String,
}

/// The policies `text` names: one policy, or every built-in one for `all`.
pub fn parse_policies(text: &str) -> Result<Vec<PolicyKind>, RequestError> {
    if text.trim() == "all" {
        return Ok(PolicyKind::ALL.to_vec());
    }
    text.parse()
        .map(|kind| vec![kind])
        .map_err(|accepted| RequestError {
            what: "policy",
            value: text.to_string(),
            reason: format!("accepted: {accepted}, or all"),
        })
}

/// A device capacity: an absolute size in any form `GPUMEM_HARD_LIMIT` accepts.
pub fn parse_capacity(text: &str) -> Result<u64, RequestError> {
    let refuse = |reason: String| RequestError {
        what: "capacity",
        value: text.to_string(),
        reason,
    };
    match parse_limit(text) {
        Ok(Limit::Bytes(bytes)) if bytes > MAX_CAPACITY => Err(refuse(format!(
            "above 1 PiB ({MAX_CAPACITY} bytes), the largest device a replay simulates"
        ))),
        Ok(Limit::Bytes(bytes)) => Ok(bytes),
        Ok(Limit::Fraction(_)) => Err(refuse(
            "a capacity must be absolute (e.g. 24GiB), not a percentage".into(),
        )),
        Err(e) => Err(refuse(format!("{e}; accepted: {ACCEPTED_BYTE_FORMS}"))),
    }
}

/// The torch and gpumem policies' settings from their configuration strings
/// (`PYTORCH_ALLOC_CONF` and `GPUMEM_POLICY_CONF` syntax), the defaults where not given; a
/// string that none of `policies` (those replayed) reads is refused.
pub fn policy_settings(
    policies: &[PolicyKind],
    pytorch_alloc_conf: Option<&str>,
    gpumem_policy_conf: Option<&str>,
) -> Result<(TorchSettings, GpumemSettings), RequestError> {
    // A setting no replayed policy reads would change nothing: refused, not ignored.
    let reads = |kinds: &[PolicyKind]| policies.iter().any(|p| kinds.contains(p));
    let unread = |what: &'static str, conf: &str, readers: &str| RequestError {
        what,
        value: conf.to_string(),
        reason: format!("no policy replayed reads it (only {readers} do); add one with --policy"),
    };
    if let Some(conf) =
        pytorch_alloc_conf.filter(|_| !reads(&[PolicyKind::Torch, PolicyKind::Expandable]))
    {
        return Err(unread("pytorch_alloc_conf", conf, "torch and expandable"));
    }
    if let Some(conf) = gpumem_policy_conf.filter(|_| !reads(&[PolicyKind::Gpumem])) {
        return Err(unread("gpumem_policy_conf", conf, "gpumem"));
    }
    let torch = match pytorch_alloc_conf {
        Some(conf) => TorchSettings::parse(conf).map_err(|e| RequestError {
            what: "pytorch_alloc_conf",
            value: conf.to_string(),
            reason: e.to_string(),
        })?,
        None => TorchSettings::default(),
    };
    let gpumem = match gpumem_policy_conf {
        Some(conf) => GpumemSettings::parse_for_vmm(conf).map_err(|e| RequestError {
            what: "gpumem_policy_conf",
            value: conf.to_string(),
            reason: e.to_string(),
        })?,
        None => GpumemSettings::default(),
    };
    Ok((torch, gpumem))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capacity_error_lists_only_what_a_capacity_accepts() {
        let e = parse_capacity("12bananas").unwrap_err().to_string();
        assert!(e.contains("1.5GiB") && !e.contains('%'), "{e}");
        let e = parse_capacity("50%").unwrap_err().to_string();
        assert!(e.contains("must be absolute"), "{e}");
        let e = parse_capacity("2000TiB").unwrap_err().to_string();
        assert!(e.contains("above 1 PiB"), "{e}");
        assert_eq!(parse_capacity("1024TiB").unwrap(), MAX_CAPACITY);
    }

    #[test]
    fn a_replay_refuses_the_gpumem_options_its_vmm_device_never_reads() {
        let all = PolicyKind::ALL;
        let e = policy_settings(&all, None, Some("max_chunk_pages:4,small_segment_mb:100"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("small_segment_mb=\"100\" is not valid: sizes segments only on a device without VMM"), "{e}");
        assert!(
            e.contains("accepted:") && !e.contains("mid_segment_mb"),
            "{e}"
        );
        assert!(policy_settings(&all, None, Some("max_chunk_pages:4")).is_ok());
    }

    #[test]
    fn a_setting_no_replayed_policy_reads_is_refused() {
        let torch = [PolicyKind::Torch];
        let e = policy_settings(&torch, None, Some("max_chunk_pages:4")).unwrap_err();
        assert_eq!(e.what, "gpumem_policy_conf");
        assert!(e.reason.contains("only gpumem do"), "{e}");
        let gpumem = [PolicyKind::Gpumem];
        let e = policy_settings(&gpumem, Some("max_split_size_mb:20"), None).unwrap_err();
        assert!(e.reason.contains("only torch and expandable do"), "{e}");
        assert!(policy_settings(
            &[PolicyKind::Expandable],
            Some("max_split_size_mb:20"),
            None
        )
        .is_ok());
    }
}
