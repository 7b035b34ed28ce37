//! Every subcommand's `--help`, snapshotted, so that a change to what a flag says (or to which
//! flags a command takes) shows in review; and the messages of bad flag values.

use std::process::{Command, Output};

fn recipe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .env_remove("CLICOLOR_FORCE")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The subcommands `recipe --help` lists.
fn subcommands() -> Vec<String> {
    let o = recipe(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = text(&o.stdout);
    help.split("Commands:\n")
        .nth(1)
        .expect("`recipe --help` lists its commands")
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn top_level_help() {
    let o = recipe(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    insta::assert_snapshot!("help", text(&o.stdout));
}

#[test]
fn every_subcommand_help_is_snapshotted() {
    let commands = subcommands();
    assert_eq!(
        commands,
        [
            "check", "fmt", "explain", "steps", "build", "verify", "diff", "run", "kernels", "lsp",
            "import"
        ],
        "a command was added or removed: snapshot its --help here"
    );
    for c in &commands {
        let o = recipe(&[c, "--help"]);
        assert_eq!(o.status.code(), Some(0), "{c}");
        assert!(o.stderr.is_empty(), "{c}: {}", text(&o.stderr));
        insta::assert_snapshot!(format!("help-{c}"), text(&o.stdout));
    }
}

/// `--format` is stated per command: where each format goes. The commands that print no report
/// (build, run, lsp) accept it for old scripts but do not list it.
#[test]
fn format_and_target_are_stated_per_command() {
    let help = |c: &str| text(&recipe(&[c, "--help"]).stdout);
    for c in ["build", "run", "lsp"] {
        assert!(!help(c).contains("--format"), "{c}");
    }
    // Still accepted: the error is the missing file, not the flag.
    for c in ["build", "run"] {
        let o = recipe(&[c, "no/such.rcp", "--format", "json"]);
        assert_eq!(o.status.code(), Some(2), "{c}");
        assert!(
            text(&o.stderr).contains("cannot read"),
            "{c}: {}",
            text(&o.stderr)
        );
    }
    for (c, says) in [
        ("check", "one JSON object per diagnostic per line on stdout"),
        ("explain", "the report as one JSON object"),
        ("steps", "{timelines, native, skipped_steps}"),
        ("diff", "one JSON array of {key, before, after}"),
        ("import", "the recipe itself always goes to stdout"),
    ] {
        let h = help(c);
        assert!(h.contains(says), "{c} --help does not say `{says}`:\n{h}");
        assert!(!h.contains("human (on stderr) or json (on stdout)"), "{c}");
    }
    // Only build takes `--target deepspeed`; the others do not talk about it.
    for c in ["check", "explain", "steps", "run", "lsp", "import"] {
        assert!(!help(c).contains("`deepspeed`"), "{c}");
    }
    assert!(help("build").contains("`native` (plan.json"));
}

/// Counts read as a person writes them, not as `1..18446744073709551615`.
#[test]
fn bad_counts_say_what_is_allowed() {
    let mut all = String::new();
    for args in [
        &["check", "recipes/cls.rcp", "--gpus", "0"][..],
        &["check", "recipes/cls.rcp", "--nodes=0"],
        &["check", "recipes/cls.rcp", "--samples", "1.5"],
        &["check", "recipes/cls.rcp", "--gpus", "x"],
        &["check", "recipes/cls.rcp", "--gpus=-2"],
        &[
            "check",
            "recipes/cls.rcp",
            "--samples",
            "99999999999999999999",
        ],
        &["run", "recipes/cls.rcp", "--stop-after", "0"],
        &["import", "x.json", "--labels", "0"],
        &["lsp", "--debounce=-1"],
    ] {
        let o = recipe(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}");
        let err = text(&o.stderr);
        assert!(!err.contains("18446744073709551615"), "{args:?}: {err}");
        all.push_str(&format!("$ recipe {}\n{err}\n", args.join(" ")));
    }
    insta::assert_snapshot!("bad-counts", all);
}
