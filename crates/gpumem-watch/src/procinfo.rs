//! Who runs a process and what it is, from `/proc` (Linux); empty strings where unreadable.

use std::os::unix::fs::MetadataExt;

/// The owner's user name and the command line of `pid`.
pub(crate) fn user_and_command(pid: u32) -> (String, String) {
    let dir = format!("/proc/{pid}");
    let user = std::fs::metadata(&dir)
        .map(|m| user_name(m.uid()))
        .unwrap_or_default();
    let command = std::fs::read(format!("{dir}/cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|part| !part.is_empty())
                .map(|part| String::from_utf8_lossy(part).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    (user, command)
}

/// Whether a process with this id exists.
pub(crate) fn is_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The name `/etc/passwd` gives `uid`, or the number.
fn user_name(uid: u32) -> String {
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| {
            passwd.lines().find_map(|line| {
                let mut fields = line.split(':');
                let name = fields.next()?;
                let id = fields.nth(1)?;
                (id.parse() == Ok(uid)).then(|| name.to_string())
            })
        })
        .unwrap_or_else(|| uid.to_string())
}

/// The uid of this process.
pub(crate) fn my_uid() -> Option<u32> {
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}
