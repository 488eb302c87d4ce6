//! Label selectors (`metav1.LabelSelector`) as requirements that all must hold.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::warning::Problem;

/// Labels of a pod or namespace: (key, value) pairs sorted by key, each key once. A sorted
/// slice rather than a map: a pod has a handful of labels, and a B-tree's node (sized for
/// eleven) cost 250 bytes more per pod at 10,000 pods.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels(Box<[(Box<str>, Box<str>)]>);

impl Labels {
    pub fn new() -> Labels {
        Labels::default()
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| (**k).cmp(key))
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.find(key).ok().map(|i| &*self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Sets `key` to `value` (replacing an earlier value).
    pub fn insert(&mut self, key: Box<str>, value: Box<str>) {
        let mut v = std::mem::take(&mut self.0).into_vec();
        match v.binary_search_by(|(k, _)| k.cmp(&key)) {
            Ok(i) => v[i].1 = value,
            Err(i) => v.insert(i, (key, value)),
        }
        self.0 = v.into_boxed_slice();
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Box<str>, &Box<str>)> {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl<'a> IntoIterator for &'a Labels {
    type Item = (&'a Box<str>, &'a Box<str>);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (Box<str>, Box<str>)>,
        fn(&'a (Box<str>, Box<str>)) -> (&'a Box<str>, &'a Box<str>),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

/// A later value for a key replaces an earlier one, as in a map.
impl FromIterator<(Box<str>, Box<str>)> for Labels {
    fn from_iter<I: IntoIterator<Item = (Box<str>, Box<str>)>>(iter: I) -> Labels {
        let map: BTreeMap<Box<str>, Box<str>> = iter.into_iter().collect();
        Labels(map.into_iter().collect())
    }
}

impl<const N: usize> From<[(Box<str>, Box<str>); N]> for Labels {
    fn from(pairs: [(Box<str>, Box<str>); N]) -> Labels {
        pairs.into_iter().collect()
    }
}

/// A parsed label selector: every requirement must hold. No requirements selects everything
/// (`{}`), as the API defines for NetworkPolicy selectors.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector {
    pub requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Requirement {
    /// `matchLabels` entries and `In` expressions; values sorted.
    In(Box<str>, Vec<Box<str>>),
    NotIn(Box<str>, Vec<Box<str>>),
    Exists(Box<str>),
    DoesNotExist(Box<str>),
}

impl Requirement {
    pub fn matches(&self, labels: &Labels) -> bool {
        match self {
            Requirement::In(key, values) => labels
                .get(key)
                .is_some_and(|v| values.iter().any(|want| &**want == v)),
            // A missing key satisfies NotIn, as in apimachinery's labels.Requirement.
            Requirement::NotIn(key, values) => labels
                .get(key)
                .is_none_or(|v| values.iter().all(|not| &**not != v)),
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::DoesNotExist(key) => !labels.contains_key(key),
        }
    }
}

impl Selector {
    /// The empty selector, which selects everything.
    pub fn everything() -> Selector {
        Selector::default()
    }

    pub fn selects_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Pairs `(key, value)` a label must equal for this selector to match: the `In`
    /// requirements with one value. Indexes use the first of them to narrow candidates.
    pub fn required_pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.requirements.iter().filter_map(|r| match r {
            Requirement::In(key, values) if values.len() == 1 => Some((&**key, &*values[0])),
            _ => None,
        })
    }

    /// Parses a Kubernetes selector. The API server rejects the malformed selectors reported
    /// here, so they come from manifests written by hand; the caller decides the safe outcome.
    pub fn parse(selector: &LabelSelector) -> Result<Selector, Problem> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            requirements.push(Requirement::In(
                key.as_str().into(),
                vec![value.as_str().into()],
            ));
        }
        for expr in selector.match_expressions.iter().flatten() {
            let key: Box<str> = expr.key.as_str().into();
            let mut values: Vec<Box<str>> = expr
                .values
                .iter()
                .flatten()
                .map(|v| v.as_str().into())
                .collect();
            values.sort();
            values.dedup();
            let requirement = match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(Problem::SelectorValuesRequired(expr.operator.clone()))
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(Problem::SelectorValuesForbidden(expr.operator.clone()))
                }
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => return Err(Problem::UnknownSelectorOperator(other.to_string())),
            };
            requirements.push(requirement);
        }
        requirements.sort();
        requirements.dedup();
        Ok(Selector { requirements })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn parse(exprs: Vec<LabelSelectorRequirement>) -> Result<Selector, Problem> {
        Selector::parse(&LabelSelector {
            match_expressions: Some(exprs),
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
        })
    }

    #[test]
    fn every_operator_and_match_labels_must_all_hold() {
        let s = parse(vec![
            expr("tier", "In", &["fe", "be"]),
            expr("env", "NotIn", &["prod"]),
            expr("team", "Exists", &[]),
            expr("legacy", "DoesNotExist", &[]),
        ])
        .unwrap();
        let good = labels(&[("app", "web"), ("tier", "fe"), ("team", "x")]);
        assert!(s.matches(&good));
        let mut prod = good.clone();
        prod.insert("env".into(), "prod".into());
        assert!(!s.matches(&prod));
        let mut legacy = good.clone();
        legacy.insert("legacy".into(), "".into());
        assert!(!s.matches(&legacy));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "fe")])));
        assert!(!s.matches(&labels(&[("app", "db"), ("tier", "fe"), ("team", "x")])));
        assert_eq!(s.required_pairs().collect::<Vec<_>>(), [("app", "web")]);
        assert!(Selector::everything().matches(&Labels::new()));
    }

    #[test]
    fn malformed_expressions_are_problems() {
        assert_eq!(
            parse(vec![expr("a", "Equals", &["x"])]),
            Err(Problem::UnknownSelectorOperator("Equals".into()))
        );
        assert_eq!(
            parse(vec![expr("a", "In", &[])]),
            Err(Problem::SelectorValuesRequired("In".into()))
        );
        assert_eq!(
            parse(vec![expr("a", "Exists", &["x"])]),
            Err(Problem::SelectorValuesForbidden("Exists".into()))
        );
    }

    #[test]
    fn labels_behave_as_a_map() {
        let mut l = labels(&[("b", "2"), ("a", "1"), ("b", "3")]);
        assert_eq!(l.len(), 2);
        assert_eq!(l.get("b"), Some("3"));
        l.insert("c".into(), "4".into());
        l.insert("a".into(), "0".into());
        let pairs: Vec<(&str, &str)> = l.iter().map(|(k, v)| (&**k, &**v)).collect();
        assert_eq!(pairs, [("a", "0"), ("b", "3"), ("c", "4")]);
        assert!(l.contains_key("c") && !l.contains_key("d"));
        assert_eq!(Labels::from([("a".into(), "0".into())]).len(), 1);
    }
}
