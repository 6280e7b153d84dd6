//! The exit codes of `tidegate` (README's CLI section, docs/cli.md):
//! 0 done; 1 the operation failed (a refusal, with the gateway's reason;
//! a bad config; a port another gateway holds); 2 usage error (clap's own,
//! and `tidegate` alone, which prints the help); 3 the admin API is
//! unreachable (no gateway at that address).

use super::admin_api::AdminError;

pub const OK: u8 = 0;
pub const FAILED: u8 = 1;
pub const USAGE: u8 = 2;
pub const UNREACHABLE: u8 = 3;

/// The code for an error that ended a command.
pub fn code(e: &anyhow::Error) -> u8 {
    let unreachable = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<AdminError>(),
            Some(AdminError::Connect { .. })
        ) || matches!(
            c.downcast_ref::<super::workload_table::TableError>(),
            Some(super::workload_table::TableError::Admin(
                AdminError::Connect { .. }
            ))
        )
    });
    if unreachable {
        UNREACHABLE
    } else {
        FAILED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_admin_is_3_anything_else_1() {
        let addr = "127.0.0.1:1".parse().unwrap();
        let connect = AdminError::Connect {
            addr,
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert_eq!(code(&anyhow::Error::new(connect)), UNREACHABLE);
        let refused = AdminError::Status {
            addr,
            status: "422".into(),
            reason: "no".into(),
        };
        assert_eq!(code(&anyhow::Error::new(refused)), FAILED);
        assert_eq!(code(&anyhow::anyhow!("bad config")), FAILED);
    }
}
