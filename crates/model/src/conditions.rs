//! Conditions that persist across polls and syncs (a manifest directory that is missing, a
//! NodePort that cannot be served) are said when they appear, again only when they change,
//! and once when they clear: an agent polling every 250 ms must not repeat the same warning
//! four times a second, and one syncing every 30 s must not bury the log in it.

use std::collections::BTreeSet;

/// The conditions said so far, each one line of text.
#[derive(Debug, Default)]
pub struct Conditions {
    current: BTreeSet<String>,
}

/// What changed in one update: lines to say, in order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Conditions present now that were not before (a changed condition is a new line).
    pub appeared: Vec<String>,
    /// Conditions said before that are gone now.
    pub cleared: Vec<String>,
}

impl Conditions {
    /// Records that exactly `now` holds and returns what differs from the last update.
    pub fn update<I, S>(&mut self, now: I) -> Changes
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let now: BTreeSet<String> = now.into_iter().map(Into::into).collect();
        let changes = Changes {
            appeared: now.difference(&self.current).cloned().collect(),
            cleared: self.current.difference(&now).cloned().collect(),
        };
        self.current = now;
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_persisting_condition_is_said_once_then_when_it_changes_and_when_it_clears() {
        let mut c = Conditions::default();
        let missing = "/m: cannot read: No such file or directory";
        let denied = "/m: cannot read: Permission denied";
        assert_eq!(
            c.update([missing]),
            Changes {
                appeared: vec![missing.into()],
                cleared: vec![]
            }
        );
        for _ in 0..10 {
            assert_eq!(c.update([missing]), Changes::default());
        }
        assert_eq!(
            c.update([denied]),
            Changes {
                appeared: vec![denied.into()],
                cleared: vec![missing.into()]
            }
        );
        assert_eq!(c.update([denied]), Changes::default());
        assert_eq!(
            c.update(None::<&str>),
            Changes {
                appeared: vec![],
                cleared: vec![denied.into()]
            }
        );
        assert_eq!(c.update(None::<&str>), Changes::default());
        // Back again: said again.
        assert_eq!(c.update([missing]).appeared, vec![missing.to_string()]);
    }

    #[test]
    fn each_of_several_conditions_is_tracked_on_its_own() {
        let mut c = Conditions::default();
        let a = "Service default/a: NodePort 30080 not served: no Node";
        let b = "Service default/b: NodePort 30081 not served: no Node";
        assert_eq!(c.update([a, b]).appeared.len(), 2);
        assert_eq!(c.update([b, a]), Changes::default());
        assert_eq!(
            c.update([b]),
            Changes {
                appeared: vec![],
                cleared: vec![a.into()]
            }
        );
    }
}
