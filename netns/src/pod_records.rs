//! The pod records of the node state directory: one per pod `tidegate-cni`
//! handed over (`<uid>.json`: uid, name, namespace and the namespace's
//! path), so a restarted gateway re-adopts every pod without a new ADD.
//! Written by the plugin before the handover, removed on DEL; read by the
//! gateway at start.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct PodRecord {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    /// `CNI_NETNS`: the path of the pod's network namespace.
    pub netns: String,
    /// The pod's addresses (`prevResult`): DEL removes their probe rules.
    #[serde(default)]
    pub ips: Vec<std::net::IpAddr>,
}

impl PodRecord {
    /// The record's file: the uid must be a plain file name.
    pub fn path(dir: &Path, uid: &str) -> io::Result<PathBuf> {
        let ok = !uid.is_empty()
            && uid.len() <= 128
            && uid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && !uid.starts_with('.');
        if !ok {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("pod uid {uid:?} is not a valid record name"),
            ));
        }
        Ok(dir.join(format!("{uid}.json")))
    }

    /// Writes the record atomically (a temporary file renamed over it).
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let path = Self::path(dir, &self.uid)?;
        let tmp = dir.join(format!(".{}.tmp", self.uid));
        std::fs::write(&tmp, serde_json::to_vec(self).map_err(io::Error::other)?)?;
        std::fs::rename(&tmp, &path)
    }

    /// `uid`'s record, if any.
    pub fn read(dir: &Path, uid: &str) -> io::Result<Option<PodRecord>> {
        match std::fs::read(Self::path(dir, uid)?) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(io::Error::other),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes `uid`'s record; an absent one is fine (DEL is idempotent).
    pub fn remove(dir: &Path, uid: &str) -> io::Result<()> {
        match std::fs::remove_file(Self::path(dir, uid)?) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    /// Every record in `dir` (none when it does not exist), each with its
    /// file and the parse result.
    pub fn read_all(dir: &Path) -> Vec<(PathBuf, Result<PodRecord, String>)> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut out: Vec<_> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .map(|p| {
                let r = std::fs::read(&p)
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
                (p, r)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_path_like_uids() {
        let dir = tempfile::tempdir().unwrap();
        let r = PodRecord {
            uid: "0b5c-11".into(),
            name: "web".into(),
            namespace: "demo".into(),
            netns: "/var/run/netns/cni-1".into(),
            // Dual-stack: both families come back (the probe exemption of
            // each is removed on DEL).
            ips: vec!["10.0.1.2".parse().unwrap(), "fd00:1::2".parse().unwrap()],
        };
        r.write(dir.path()).unwrap();
        r.write(dir.path()).unwrap();
        std::fs::write(dir.path().join("junk.json"), b"{").unwrap();
        let all = PodRecord::read_all(dir.path());
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].1.as_ref().unwrap(), &r);
        assert!(all[1].1.is_err());
        PodRecord::remove(dir.path(), "0b5c-11").unwrap();
        PodRecord::remove(dir.path(), "0b5c-11").unwrap();
        assert!(PodRecord::read_all(dir.path())[0].0.ends_with("junk.json"));
        for bad in ["../x", "", ".hidden", "a/b"] {
            assert!(PodRecord::path(dir.path(), bad).is_err(), "{bad}");
        }
        assert!(PodRecord::read_all(&dir.path().join("absent")).is_empty());
    }
}
