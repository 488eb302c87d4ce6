//! Label and field selectors as the API server reads them from a query string (the subset
//! clients send for these kinds: existence, equality and inequality terms, comma-joined).

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
}

/// A parsed label selector (`a`, `!a`, `a=b`, `a==b`, `a!=b`, comma-joined; all must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Term>);

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for raw in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if raw.contains(" in ") || raw.contains(" notin ") || raw.contains('(') {
                return Err(format!("unsupported label selector term {raw:?}"));
            }
            terms.push(parse_term(raw, true)?);
        }
        Ok(LabelSelector(terms))
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|t| match t {
            Term::Exists(k) => get(k).is_some(),
            Term::NotExists(k) => get(k).is_none(),
            Term::Equals(k, v) => get(k) == Some(v.as_str()),
            Term::NotEquals(k, v) => get(k) != Some(v.as_str()),
        })
    }
}

/// A parsed field selector (`path=value`, `path==value`, `path!=value` over dotted paths
/// such as `metadata.name` or `spec.clusterIP`; a missing field reads as "").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<Term>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for raw in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            match parse_term(raw, false)? {
                t @ (Term::Equals(..) | Term::NotEquals(..)) => terms.push(t),
                _ => return Err(format!("field selector term {raw:?} needs an operator")),
            }
        }
        Ok(FieldSelector(terms))
    }

    /// The fields the selector tests (`spec.clusterIP`, …).
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|t| match t {
            Term::Equals(k, _) | Term::NotEquals(k, _) | Term::Exists(k) | Term::NotExists(k) => {
                k.as_str()
            }
        })
    }

    pub fn matches(&self, object: &Value) -> bool {
        let get = |path: &str| {
            let pointer = format!("/{}", path.replace('.', "/"));
            object
                .pointer(&pointer)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        self.0.iter().all(|t| match t {
            Term::Equals(p, v) => get(p) == *v,
            Term::NotEquals(p, v) => get(p) != *v,
            Term::Exists(_) | Term::NotExists(_) => true,
        })
    }
}

fn parse_term(raw: &str, existence: bool) -> Result<Term, String> {
    let bad = || format!("invalid selector term {raw:?}");
    if let Some((k, v)) = raw.split_once("!=") {
        return Ok(Term::NotEquals(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = raw.split_once("==").or_else(|| raw.split_once('=')) {
        return Ok(Term::Equals(k.trim().into(), v.trim().into()));
    }
    if !existence {
        return Err(bad());
    }
    match raw.strip_prefix('!') {
        Some(k) if !k.trim().is_empty() => Ok(Term::NotExists(k.trim().into())),
        Some(_) => Err(bad()),
        None => Ok(Term::Exists(raw.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_terms_as_kube_proxy_sends_them() {
        let sel = LabelSelector::parse("!service.kubernetes.io/service-proxy-name").unwrap();
        assert!(sel.matches(&json!({"metadata": {"name": "a"}})));
        assert!(!sel.matches(&json!({"metadata": {"labels": {
            "service.kubernetes.io/service-proxy-name": "other"}}})));
        let sel = LabelSelector::parse("app=web,tier!=db,env").unwrap();
        assert!(sel.matches(&json!({"metadata": {"labels": {"app": "web", "env": "x"}}})));
        assert!(!sel
            .matches(&json!({"metadata": {"labels": {"app": "web", "tier": "db", "env": "x"}}})));
        assert!(LabelSelector::parse("app in (a,b)").is_err());
    }

    #[test]
    fn field_terms_over_dotted_paths() {
        let sel = FieldSelector::parse("spec.clusterIP!=None").unwrap();
        assert!(sel.matches(&json!({"spec": {"clusterIP": "10.96.0.1"}})));
        assert!(!sel.matches(&json!({"spec": {"clusterIP": "None"}})));
        let sel = FieldSelector::parse("metadata.name=node-a").unwrap();
        assert!(sel.matches(&json!({"metadata": {"name": "node-a"}})));
        assert!(!sel.matches(&json!({"metadata": {"name": "node-b"}})));
        assert!(FieldSelector::parse("metadata.name").is_err());
    }
}
