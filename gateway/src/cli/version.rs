//! `tidegate version [-o json|yaml]`: this binary's version, commit and
//! build profile, and the versions it speaks: the policy WIT contracts the
//! plugin host loads, ZDS, xDS (delta ADS, its type URLs), HBONE.

use super::Output;
use crate::build_info::BuildInfo;

pub fn render(output: Output) -> String {
    let info = BuildInfo::get();
    output.render(&info, || {
        format!(
            "tidegate {} (commit {}, {})\n\
             policy contracts: {}\n\
             ZDS: istio.workload.zds hello version {}\n\
             xDS: {} ({})\n\
             HBONE: {}\n",
            info.version,
            info.commit,
            info.profile,
            info.policy_contracts.join(", "),
            info.zds_version,
            info.xds_method,
            info.xds_type_urls.join(", "),
            info.hbone,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_names_version_commit_and_protocols() {
        let v: serde_json::Value = serde_json::from_str(&render(Output::Json)).unwrap();
        assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
        assert!(!v["commit"].as_str().unwrap().is_empty());
        assert_eq!(v["policy_contracts"][0], "tidegate:policy@0.3.0");
        assert_eq!(v["zds_version"], 1);
        assert_eq!(
            v["xds_type_urls"][0],
            "type.googleapis.com/istio.workload.Address"
        );
        let table = render(Output::Table);
        assert!(table.starts_with(&format!("tidegate {} (commit ", env!("CARGO_PKG_VERSION"))));
        assert!(
            table.contains("policy contracts: tidegate:policy@0.3.0"),
            "{table}"
        );
    }
}
