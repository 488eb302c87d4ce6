//! The planner kept between changes against a plan from scratch: two random clusters (the
//! oracle test's generator), the first loaded, then a random walk of changes towards the
//! second (a pod, policy or namespace added, changed to the second's version, or removed).
//! After every change each node's [`NodePlanner`] must plan exactly what [`plan`] plans from
//! the same objects: every compiled policy a change could affect was recompiled. The nft
//! ruleset made reusing the previous one's unchanged chains equals one made from scratch.

mod common;

use std::cell::Cell;

use common::{ClusterGen, NODES};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use weir_policy::k8s_openapi::api::core::v1::{Namespace, Pod};
use weir_policy::k8s_openapi::api::networking::v1::NetworkPolicy;
use weir_policy::model::NamespaceInfo;
use weir_policy::nft::Ruleset;
use weir_policy::{plan, Cluster, Converted, NodePlanner, PolicyPlan};

#[derive(Debug, Clone, Copy)]
enum Step {
    /// The second cluster's pod, namespace or policy `i` (modulo their count): added, or
    /// replacing the first's object of that name.
    Pod(usize),
    Namespace(usize),
    Policy(usize),
    /// The `i`th current pod, namespace or policy (modulo their count) removed.
    RemovePod(usize),
    RemoveNamespace(usize),
    RemovePolicy(usize),
    /// The `i`th namespace of `common::NAMESPACES` labelled team=x, team=y or unlabelled
    /// (by `i / 3 % 3`).
    Team(usize),
}

fn step() -> impl Strategy<Value = Step> {
    (0u8..7, 0usize..64).prop_map(|(kind, i)| match kind {
        0 => Step::Pod(i),
        1 => Step::Namespace(i),
        2 => Step::Policy(i),
        3 => Step::RemovePod(i),
        4 => Step::RemoveNamespace(i),
        5 => Step::Team(i),
        _ => Step::RemovePolicy(i),
    })
}

struct Next {
    namespaces: Vec<Namespace>,
    pods: Vec<Pod>,
    policies: Vec<NetworkPolicy>,
}

/// Applies `step` to the reference cluster and to every planner.
fn apply(step: Step, next: &Next, cluster: &mut Cluster, planners: &mut [NodePlanner]) {
    match step {
        Step::Pod(i) if !next.pods.is_empty() => {
            let pod = Converted::pod(&next.pods[i % next.pods.len()]).value;
            cluster.insert_pod(pod.clone());
            planners.iter_mut().for_each(|p| p.insert_pod(pod.clone()));
        }
        Step::Namespace(i) if !next.namespaces.is_empty() => {
            let ns = std::sync::Arc::new(NamespaceInfo::from(
                &next.namespaces[i % next.namespaces.len()],
            ));
            cluster.insert_namespace(ns.clone());
            planners
                .iter_mut()
                .for_each(|p| p.insert_namespace(ns.clone()));
        }
        Step::Policy(i) if !next.policies.is_empty() => {
            let policy = Converted::policy(&next.policies[i % next.policies.len()]).value;
            cluster.insert_policy(policy.clone());
            planners
                .iter_mut()
                .for_each(|p| p.insert_policy(policy.clone()));
        }
        Step::RemovePod(i) if !cluster.pods.is_empty() => {
            let key = cluster
                .pods
                .keys()
                .nth(i % cluster.pods.len())
                .unwrap()
                .clone();
            cluster.remove_pod(&key);
            planners.iter_mut().for_each(|p| {
                p.remove_pod(&key);
            });
        }
        Step::RemoveNamespace(i) if !cluster.namespaces.is_empty() => {
            let n = cluster.namespaces.len();
            let name = cluster.namespaces.keys().nth(i % n).unwrap().clone();
            cluster.remove_namespace(&name);
            planners.iter_mut().for_each(|p| {
                p.remove_namespace(&name);
            });
        }
        Step::RemovePolicy(i) if !cluster.policies.is_empty() => {
            let n = cluster.policies.len();
            let key = cluster.policies.keys().nth(i % n).unwrap().clone();
            cluster.remove_policy(&key);
            planners.iter_mut().for_each(|p| {
                p.remove_policy(&key);
            });
        }
        Step::Team(i) => {
            let name = common::NAMESPACES[i % common::NAMESPACES.len()];
            let team = ["x", "y", ""][i / 3 % 3];
            let labels = [("team".into(), team.into())].into_iter();
            let labels = labels
                .filter(|(_, v): &(Box<str>, Box<str>)| !v.is_empty())
                .collect();
            let ns = std::sync::Arc::new(NamespaceInfo::new(name, labels));
            cluster.insert_namespace(ns.clone());
            planners
                .iter_mut()
                .for_each(|p| p.insert_namespace(ns.clone()));
        }
        _ => {}
    }
}

/// One case: `first` loaded, then `steps`; the plans compared before some steps and at the
/// end. Returns how many local pods the compared plans held.
fn check(first: &ClusterGen, second: &ClusterGen, steps: &[Step]) -> Result<usize, TestCaseError> {
    let (namespaces, pods, policies) = first.objects();
    let (mut cluster, _) = Cluster::from_objects(&namespaces, &pods, &policies);
    let (namespaces, pods, policies) = second.objects();
    let next = Next {
        namespaces,
        pods,
        policies,
    };
    let mut planners: Vec<NodePlanner> = NODES
        .iter()
        .map(|n| NodePlanner::new(cluster.clone(), n))
        .collect();
    let mut planned = 0;
    let mut rulesets: Vec<Option<(PolicyPlan, Ruleset)>> = vec![None; NODES.len()];
    for (k, step) in steps.iter().enumerate() {
        // Plans between some changes only: changes also pile up between two plans.
        if k % 3 != 1 {
            let nodes = planners.iter_mut().zip(NODES).zip(&mut rulesets);
            for ((planner, node), previous) in nodes {
                let fresh = plan(&cluster, node);
                planned += fresh.pods.len();
                let kept = planner.plan();
                prop_assert_eq!(&kept, &fresh, "{} before step {} {:?}", node, k, step);
                // The ruleset reusing the previous one's unchanged chains is the same too.
                let after = previous.as_ref().map(|(p, r)| (p, r));
                let ruleset = Ruleset::from_plan_after(&kept, after);
                prop_assert_eq!(&ruleset, &Ruleset::from_plan(&fresh));
                *previous = Some((kept, ruleset));
            }
        }
        apply(*step, &next, &mut cluster, &mut planners);
    }
    for (planner, node) in planners.iter_mut().zip(NODES) {
        prop_assert_eq!(planner.plan(), plan(&cluster, node), "{} at the end", node);
    }
    Ok(planned)
}

#[test]
fn plans_kept_between_changes_equal_plans_from_scratch() {
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 512,
        ..ProptestConfig::default()
    });
    let planned = Cell::new(0);
    let cases = (
        common::cluster(),
        common::cluster(),
        prop::collection::vec(step(), 1..24),
    );
    runner
        .run(&cases, |(first, second, steps)| {
            planned.set(planned.get() + check(&first, &second, &steps)?);
            Ok(())
        })
        .unwrap();
    assert!(planned.get() > 1000, "the plans compared held pods");
}
