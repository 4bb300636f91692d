//! Who runs a process and what it is, from `/proc` (Linux); empty strings where unreadable.

#[cfg(feature = "nvml")]
use std::os::unix::fs::MetadataExt;

/// The owner's user name and the command line of `pid`.
#[cfg(feature = "nvml")]
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
#[cfg(feature = "nvml")]
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

/// Clock ticks per second of `/proc/<pid>/stat`'s times (`USER_HZ`, 100 on Linux's
/// mainstream architectures).
#[cfg(feature = "nvml")]
pub(crate) const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time `pid` has used so far (user + system), in clock ticks.
#[cfg(feature = "nvml")]
pub(crate) fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command (field 2) may hold spaces and parentheses: count fields after the last ')'.
    let mut fields = stat.get(stat.rfind(')')? + 2..)?.split_whitespace();
    // After the command: state (3), …, utime (14), stime (15).
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(all(test, feature = "nvml"))]
mod tests {
    #[test]
    fn this_process_has_a_name_and_counts_cpu_time() {
        let pid = std::process::id();
        let (user, command) = super::user_and_command(pid);
        assert!(!user.is_empty());
        assert!(command.contains("gpumem_watch"), "{command}");
        let before = super::cpu_ticks(pid).unwrap();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(100) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(super::cpu_ticks(pid).unwrap() >= before);
        assert!(super::cpu_ticks(u32::MAX).is_none());
    }
}
