//! What the benches read of other processes from /proc: a process's
//! descendants and the fields of its `stat`.

/// `pid` and every descendant (from /proc/*/stat's ppid).
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut parent = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some(pp) = stat_fields(p).and_then(|f| f.get(1).and_then(|x| x.parse::<u32>().ok()))
        {
            parent.push((p, pp));
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

/// The fields of /proc/<pid>/stat after the command name (state first).
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    Some(after.split_whitespace().map(str::to_owned).collect())
}
