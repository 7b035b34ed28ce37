//! Launch rules: the `deepspeed` launcher command `launch.sh` runs, against the cluster the
//! recipe declares (`cluster { gpus, nodes, hostfile }`).
//!
//! The launcher (deepspeedai/DeepSpeed@v0.19.8 deepspeed/launcher/runner.py) reads the hostfile
//! (`--hostfile`, default `/job/hostfile`) into `host -> slots`, one `host slots=N` line per node
//! (`#` comments and blank lines skipped; a duplicate host, any other line or no host at all stop
//! it), keeps the first `--num_nodes` hosts and starts `--num_gpus` processes on each
//! (`apply_num_nodes_and_gpus`; the slots are not compared with `--num_gpus`). With no hostfile
//! it runs on the local GPUs and refuses `--num_nodes` > 1 ("Num nodes is >1 but no extra nodes
//! available via hostfile"). A hostfile with fewer hosts than `--num_nodes` is not refused: the
//! run starts on the hosts there are, at a smaller world size than the batch was computed for,
//! and DeepSpeed's batch assertion stops it once the model is loaded.
//!
//! A hostfile that is here (relative paths from the recipe's directory, as `launch.sh` runs
//! there) is read and parsed as the launcher parses it; one that is not here is taken to be on
//! the cluster and is not checked.

use crate::diagnostics::Diagnostic;
use crate::resolve::{files, Resolved, Source};

use super::anchor;

/// Several nodes, and the hostfile is the launcher's default: nothing in the recipe lists them.
pub const HOSTFILE_DEFAULT: &str = "R1001";
/// The hostfile is here and the launcher would refuse it.
pub const HOSTFILE_INVALID: &str = "R1002";
/// The hostfile lists fewer hosts than `nodes`: the run starts on fewer GPUs than the batch says.
pub const HOSTFILE_TOO_FEW_NODES: &str = "R1003";
/// A host has fewer slots than `gpus`: the launcher starts `gpus` processes on it anyway.
pub const HOSTFILE_TOO_FEW_SLOTS: &str = "R1004";

/// DeepSpeed's default hostfile (`DLTS_HOSTFILE` in launcher/runner.py).
pub const DEFAULT_HOSTFILE: &str = "/job/hostfile";

/// This family's codes.
pub const CODES: &[(&str, &str, &str)] = &[
    (
        HOSTFILE_DEFAULT,
        "hostfile-default",
        "several nodes, and no hostfile named: the launcher reads /job/hostfile",
    ),
    (
        HOSTFILE_INVALID,
        "hostfile-invalid",
        "a hostfile line the launcher refuses",
    ),
    (
        HOSTFILE_TOO_FEW_NODES,
        "hostfile-too-few-nodes",
        "the hostfile lists fewer hosts than `nodes`",
    ),
    (
        HOSTFILE_TOO_FEW_SLOTS,
        "hostfile-too-few-slots",
        "a host in the hostfile has fewer slots than `gpus`",
    ),
];

/// Runs the launch rules.
pub fn check(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let nodes = r.count("cluster.nodes");
    let Some(setting) = r.get("cluster.hostfile") else {
        return;
    };
    if matches!(setting.source, Source::Default { .. }) {
        if nodes > 1 {
            out.push(hostfile_default(r, nodes));
        }
        return;
    }
    let Some(written) = r.str("cluster.hostfile") else {
        return;
    };
    let path = files::local_path(r, written);
    // Not here (or not a file): on the cluster, not checked.
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    match parse_hostfile(&text) {
        Err(bad) => out.push(invalid(r, written, &bad)),
        Ok(hosts) => {
            if nodes > 1 && (hosts.len() as u64) < nodes {
                out.push(too_few_nodes(r, written, &hosts, nodes));
            }
            let gpus = r.count("cluster.gpus");
            // The hosts the launcher keeps: the first `nodes`.
            let used = &hosts[..hosts.len().min(nodes as usize)];
            if let Some(h) = used.iter().find(|h| h.slots < gpus) {
                out.push(too_few_slots(r, written, h, gpus));
            }
        }
    }
}

/// One host line of a hostfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The host name, as written.
    pub name: String,
    /// Its `slots=` count.
    pub slots: u64,
    /// Its line number (1-based).
    pub line: usize,
}

/// Why the launcher refuses a hostfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadHostfile {
    /// A line that is neither a comment, blank, nor `host slots=N`.
    BadLine { line: usize, text: String },
    /// A host listed twice.
    Duplicate {
        line: usize,
        first: usize,
        host: String,
    },
    /// No host line at all.
    Empty,
}

/// Parses a hostfile as the DeepSpeed launcher does (`_parse_hostfile`: each stripped line
/// matching `^(\S+)\s+slots=(\d+)`, anything after it ignored; `#` lines and blank lines
/// skipped).
pub fn parse_hostfile(text: &str) -> Result<Vec<Host>, BadHostfile> {
    let mut hosts: Vec<Host> = Vec::new();
    // Python reads the file with universal newlines: "\r\n", "\n" and a lone "\r" end a line.
    let text = text.replace("\r\n", "\n");
    for (i, raw) in text.split(['\n', '\r']).enumerate() {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let Some((name, slots)) = host_line(l) else {
            return Err(BadHostfile::BadLine {
                line,
                text: l.to_string(),
            });
        };
        if let Some(first) = hosts.iter().find(|h| h.name == name) {
            return Err(BadHostfile::Duplicate {
                line,
                first: first.line,
                host: name.to_string(),
            });
        }
        hosts.push(Host {
            name: name.to_string(),
            slots,
            line,
        });
    }
    if hosts.is_empty() {
        return Err(BadHostfile::Empty);
    }
    Ok(hosts)
}

/// `host <whitespace> slots=<digits>` at the start of a stripped line.
fn host_line(l: &str) -> Option<(&str, u64)> {
    let end = l.find(char::is_whitespace)?;
    let (name, rest) = l.split_at(end);
    let rest = rest.trim_start().strip_prefix("slots=")?;
    let digits: &str = &rest[..rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len())];
    if digits.is_empty() {
        return None;
    }
    // Python's int() has no overflow: a count beyond u64 saturates (no real host has it).
    // Python's `\d` also takes non-ASCII decimal digits; those are not accepted here.
    Some((name, digits.parse().unwrap_or(u64::MAX)))
}

fn hostfile_default(r: &Resolved, nodes: u64) -> Diagnostic {
    let d = Diagnostic::warning(
        HOSTFILE_DEFAULT,
        format!(
            "{nodes} nodes, but no `hostfile` names them: the DeepSpeed launcher reads {DEFAULT_HOSTFILE}, and where there is none it stops with \"Num nodes is >1 but no extra nodes available via hostfile\""
        ),
        anchor(r, "cluster.nodes"),
    )
    .with_label(format!("nodes = {nodes}{}", super::origin(r, "cluster.nodes")))
    .with_help(format!(
        "set `hostfile = \"…\"` in `cluster`: one `host slots={}` line per node; launch.sh passes --hostfile {DEFAULT_HOSTFILE} until then",
        r.count("cluster.gpus")
    ));
    // Stating the launcher's default makes the recipe say where the hosts are read from; the
    // file itself is then checked wherever it exists.
    super::fix::with_set(
        d,
        r,
        "cluster.hostfile",
        &crate::commands::format::quote(DEFAULT_HOSTFILE),
    )
}

fn invalid(r: &Resolved, written: &str, bad: &BadHostfile) -> Diagnostic {
    let (message, help) = match bad {
        BadHostfile::BadLine { line, text } => (
            format!(
                "\"{written}\":{line} is not a host line: the DeepSpeed launcher stops with \"Hostfile contains a bad entry: {text}\""
            ),
            "each line is `hostname slots=N` (or a `#` comment)".to_string(),
        ),
        BadHostfile::Duplicate { line, first, host } => (
            format!(
                "\"{written}\":{line} lists `{host}` again (first at line {first}): the DeepSpeed launcher stops with \"Hostfile contains multiple entries for {host}\""
            ),
            format!("keep one line for `{host}`"),
        ),
        BadHostfile::Empty => (
            format!(
                "\"{written}\" lists no host: the DeepSpeed launcher stops with \"Hostfile is empty or not formatted correctly\""
            ),
            "add one `hostname slots=N` line per node".to_string(),
        ),
    };
    Diagnostic::error(HOSTFILE_INVALID, message, anchor(r, "cluster.hostfile"))
        .with_label("the hostfile launch.sh passes")
        .with_help(help)
}

fn too_few_nodes(r: &Resolved, written: &str, hosts: &[Host], nodes: u64) -> Diagnostic {
    let gpus = r.count("cluster.gpus");
    let n = hosts.len() as u64;
    let mut d = Diagnostic::error(
        HOSTFILE_TOO_FEW_NODES,
        format!(
            "\"{written}\" lists {n} host{} for {nodes} nodes: the launcher starts on {n} × {gpus} GPUs, not {}, and DeepSpeed's batch check fails once the model is loaded",
            if n == 1 { "" } else { "s" },
            nodes * gpus
        ),
        anchor(r, "cluster.hostfile"),
    )
    .with_label(format!(
        "{n} host{}: {}",
        if n == 1 { "" } else { "s" },
        hosts
            .iter()
            .map(|h| h.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if let Some(span) = r.span("cluster.nodes") {
        d = d.with_secondary(span, format!("{nodes} nodes"));
    }
    d.with_help(format!(
        "add the missing host{} to the hostfile, or set `nodes = {n}` (the batch follows the world size)",
        if nodes - n == 1 { "" } else { "s" }
    ))
}

fn too_few_slots(r: &Resolved, written: &str, host: &Host, gpus: u64) -> Diagnostic {
    let mut d = Diagnostic::warning(
        HOSTFILE_TOO_FEW_SLOTS,
        format!(
            "\"{written}\":{} gives `{}` {} slot{}, but the launcher starts {gpus} processes on every node (`--num_gpus {gpus}`): where it has {} GPUs, local ranks {}–{} find none",
            host.line,
            host.name,
            host.slots,
            if host.slots == 1 { "" } else { "s" },
            host.slots,
            host.slots,
            gpus - 1
        ),
        anchor(r, "cluster.hostfile"),
    )
    .with_label(format!("{} slots={}", host.name, host.slots));
    if let Some(span) = r.span("cluster.gpus") {
        d = d.with_secondary(span, format!("{gpus} GPUs per node"));
    }
    d.with_help(format!(
        "if `{}` has {} GPUs, set `gpus = {}`; otherwise correct its slots",
        host.name, host.slots, host.slots
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_as_the_launcher_does() {
        let h =
            parse_hostfile("# nodes\n\nworker-1 slots=8\n  worker-2   slots=4 extra\n").unwrap();
        assert_eq!(
            h,
            vec![
                Host {
                    name: "worker-1".into(),
                    slots: 8,
                    line: 3
                },
                Host {
                    name: "worker-2".into(),
                    slots: 4,
                    line: 4
                }
            ]
        );
        // `slots=8x` matches the launcher's regex (`\d+` then anything).
        assert_eq!(parse_hostfile("a slots=8x").unwrap()[0].slots, 8);
    }

    #[test]
    fn refuses_what_the_launcher_refuses() {
        assert_eq!(
            parse_hostfile("a slots=8\nb:8\n"),
            Err(BadHostfile::BadLine {
                line: 2,
                text: "b:8".into()
            })
        );
        assert_eq!(
            parse_hostfile("a slots=8\na slots=4\n"),
            Err(BadHostfile::Duplicate {
                line: 2,
                first: 1,
                host: "a".into()
            })
        );
        assert_eq!(parse_hostfile("# none\n\n"), Err(BadHostfile::Empty));
        assert!(parse_hostfile("a slots=").is_err());
        assert!(parse_hostfile("a slots = 8").is_err());
        assert!(parse_hostfile("slots=8").is_err());
    }
}
