//! One doctor check's result: its status, the evidence it rests on and the fix. Shared by
//! [`crate::doctor`]'s node checks and [`crate::doctor_policy`]'s object checks, which
//! `doctor::run_all` runs: a module of its own, so the two import no circle.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Skip,
    Warn,
    Fail,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Skip => "skip",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub id: &'static str,
    pub title: &'static str,
    pub status: Status,
    pub evidence: Vec<String>,
    /// What to do; `None` when there is nothing to fix.
    pub fix: Option<String>,
}

impl Check {
    pub(crate) fn new(id: &'static str, title: &'static str) -> Check {
        Check {
            id,
            title,
            status: Status::Ok,
            evidence: Vec::new(),
            fix: None,
        }
    }

    pub(crate) fn skip(mut self, why: impl Into<String>) -> Check {
        self.status = Status::Skip;
        self.evidence.push(why.into());
        self
    }

    /// Raises the status to `s` (never lowers it) and records why.
    pub(crate) fn found(&mut self, s: Status, evidence: impl Into<String>) {
        self.status = self.status.max(s);
        self.evidence.push(evidence.into());
    }

    pub(crate) fn note(&mut self, evidence: impl Into<String>) {
        self.evidence.push(evidence.into());
    }

    pub(crate) fn add_fix(&mut self, fix: impl Into<String>) {
        let fix = fix.into();
        match &mut self.fix {
            Some(f) if !f.contains(&fix) => {
                f.push_str("; ");
                f.push_str(&fix);
            }
            Some(_) => {}
            None => self.fix = Some(fix),
        }
    }
}
