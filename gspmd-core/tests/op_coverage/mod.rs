//! Op coverage measured from what a test binary actually runs, not from a hand-kept
//! list. A suite calls [`record`] wherever it has checked a program (interpreted it
//! against expected values, compared gradients with finite differences, checked its
//! shardings); its `covers_every_op_kind` test calls [`kinds_checked`], which runs every
//! other test of the binary in a child process with recording on, and compares the op
//! kinds recorded with the kinds the suite must cover ([`assert_kinds`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::process::Command;
use std::sync::Mutex;

use gspmd_core::ir::{OpKind, Program};

/// The file [`record`] appends to; set only for the child run of [`kinds_checked`].
const RECORD_TO: &str = "GSPMD_RECORD_OP_KINDS";

/// Serialises appends from the test threads of one process.
static APPEND: Mutex<()> = Mutex::new(());

/// Notes that the running test checked `program` in the way `how` names (e.g.
/// `"interpreted"`). Does nothing unless the binary runs under [`kinds_checked`].
pub fn record(how: &str, program: &Program) {
    record_kinds(how, program.nodes.iter().map(|n| n.op.kind()));
}

/// [`record`] for op kinds a test checked without one program holding them all.
pub fn record_kinds(how: &str, kinds: impl IntoIterator<Item = OpKind>) {
    let Some(path) = std::env::var_os(RECORD_TO) else {
        return;
    };
    let lines: String = kinds
        .into_iter()
        .map(|k| format!("{how} {k:?}\n"))
        .collect();
    let _guard = APPEND.lock().unwrap_or_else(|e| e.into_inner());
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("the op-kind record file opens");
    file.write_all(lines.as_bytes())
        .expect("the op-kind record file takes a write");
}

/// Runs every test of this binary except `this_test` in a child process with recording
/// on, and returns the op kinds recorded, by `how`. Fails if any of those tests fails:
/// only passing checks count as coverage.
pub fn kinds_checked(this_test: &str) -> BTreeMap<String, BTreeSet<OpKind>> {
    let exe = std::env::current_exe().expect("the test binary's path");
    let name = (exe.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let path =
        std::env::temp_dir().join(format!("gspmd-op-kinds-{name}-{}.txt", std::process::id()));
    // A stale file of a reused process id would add kinds this run did not check.
    let _ = std::fs::remove_file(&path);
    let out = Command::new(&exe)
        .args(["--skip", this_test, "--quiet"])
        .env(RECORD_TO, &path)
        .output()
        .expect("the test binary runs again");
    assert!(
        out.status.success(),
        "the suite's other tests fail, so its coverage is not measured:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    let mut kinds: BTreeMap<String, BTreeSet<OpKind>> = BTreeMap::new();
    for line in text.lines() {
        let (how, kind) = line.split_once(' ').expect("a `how kind` line");
        let kind = *OpKind::ALL
            .iter()
            .find(|k| format!("{k:?}") == kind)
            .expect("a recorded kind is an OpKind");
        kinds.entry(how.to_string()).or_default().insert(kind);
    }
    kinds
}

/// Fails, naming them, unless `got` (the kinds checked `how`) include every kind of
/// [`OpKind::ALL`] that `required` selects, and only kinds that `allowed` selects.
pub fn assert_kinds(
    how: &str,
    got: Option<&BTreeSet<OpKind>>,
    required: impl Fn(OpKind) -> bool,
    allowed: impl Fn(OpKind) -> bool,
) {
    let got = got.cloned().unwrap_or_default();
    let missing: Vec<OpKind> = (OpKind::ALL.iter().copied())
        .filter(|&k| required(k) && !got.contains(&k))
        .collect();
    let unexpected: Vec<OpKind> = got.into_iter().filter(|&k| !allowed(k)).collect();
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "op kinds {how}: missing a case for {missing:?}; not expected here: {unexpected:?}"
    );
}
