use weir_model::Plan;
use weir_proxy::nft::{render_full, render_update, NftOptions};

mod common;
use common::{golden, in_netns, load};

#[test]
fn golden_full_and_update() {
    let o = NftOptions::default();
    let v1 = load("v1");
    let v2 = load("v2");
    golden("v1.nft", &render_full(&v1, &o));
    golden("v2.nft", &render_full(&v2, &o));
    golden("v1-to-v2.nft", &render_update(&v1, &v2, &v1.diff(&v2), &o));
    assert!(render_update(&v1, &v2, &v1.diff(&v2), &o).starts_with("# weir update"));
    assert_eq!(
        render_update(&v2, &v2, &v2.diff(&v2), &o).lines().count(),
        1,
        "no-op update is empty"
    );
    // A change that needs a balancing chain the old ruleset lacks creates it incrementally.
    let v3 = with_more_web_endpoints(&v2);
    let u = render_update(&v2, &v3, &v2.diff(&v3), &o);
    assert!(u.starts_with("# weir update"), "{u}");
    assert!(u.contains("add chain inet weir ep4tcp-n4-o"), "{u}");
}

/// `v2` with two more endpoints for `web` (a balancing chain class v2 does not have).
fn with_more_web_endpoints(v2: &Plan) -> Plan {
    let mut v3 = v2.clone();
    let web = v3
        .services
        .keys()
        .find(|k| k.name.as_ref() == "web")
        .unwrap()
        .clone();
    let sp = std::sync::Arc::make_mut(v3.services.get_mut(&web).unwrap());
    let extra = weir_model::Endpoint {
        ip: "10.244.9.9".parse().unwrap(),
        ..sp.cluster_endpoints[0].clone()
    };
    sp.cluster_endpoints.push(extra.clone());
    sp.cluster_endpoints.push(weir_model::Endpoint {
        ip: "10.244.9.10".parse().unwrap(),
        ..extra
    });
    v3
}

/// Root and `nft`, `unshare`, or the test is skipped (a failure under CI=true, naming what is missing).
fn can_run_nft() -> bool {
    weir_testkit::can_run(weir_testkit::missing(true, &["nft", "unshare"]))
}

#[test]
fn full_scripts_pass_nft_check_and_updates_apply() {
    if !can_run_nft() {
        return;
    }
    let o = NftOptions::default();
    let v1 = load("v1");
    let v2 = load("v2");
    let tmp = std::env::temp_dir().join(format!("weir-nft-test-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let f1 = tmp.join("v1.nft");
    let f2 = tmp.join("v2.nft");
    let u12 = tmp.join("u12.nft");
    let u21 = tmp.join("u21.nft");
    std::fs::write(&f1, render_full(&v1, &o)).unwrap();
    std::fs::write(&f2, render_full(&v2, &o)).unwrap();
    std::fs::write(&u12, render_update(&v1, &v2, &v1.diff(&v2), &o)).unwrap();
    std::fs::write(&u21, render_update(&v2, &v1, &v2.diff(&v1), &o)).unwrap();
    let v3 = with_more_web_endpoints(&v2);
    let u23 = tmp.join("u23.nft");
    std::fs::write(&u23, render_update(&v2, &v3, &v2.diff(&v3), &o)).unwrap();
    let (f1, f2, u12, u21) = (f1.display(), f2.display(), u12.display(), u21.display());
    let u23 = u23.display();
    // Check mode on the full scripts, then load v1, update to v2 and back, reload full
    // (replace), then an update that needs a new balancing chain.
    let (ok, log) = in_netns(&format!(
        "nft -c -f {f1}; nft -c -f {f2}; nft -f {f1}; nft -f {u12}; nft -f {u21}; nft -f {u12}; nft -f {f2}; nft -f {f1}; nft -f {f2}; nft -f {u23}; nft list chain inet weir ep4tcp-n4-o"
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(ok, "{log}");
}

#[test]
fn conflicting_frontends_keep_the_first_and_say_so() {
    let mut p = load("v1");
    // Give a second service port the same externalIP frontend as `one`.
    let one = p
        .services
        .keys()
        .find(|k| k.name.as_ref() == "one")
        .unwrap()
        .clone();
    let mut dup = (*p.services[&one]).clone();
    let mut key = one.clone();
    key.name = "one-copy".into();
    dup.cluster_endpoints[0].ip = "10.244.7.7".parse().unwrap();
    dup.frontends
        .retain(|f| f.kind == weir_model::FrontendKind::ExternalIp);
    p.services.insert(key, dup.into());
    let s = render_full(&p, &NftOptions::default());
    assert!(
        s.contains("# conflict: ep4tcp: duplicate key 198.51.100.6 . tcp . 443 . 0"),
        "{s}"
    );
    assert!(
        s.contains("# conflict: svc4: duplicate key 198.51.100.6 . tcp . 443"),
        "{s}"
    );
    assert!(!s
        .lines()
        .any(|l| !l.starts_with('#') && l.contains("198.51.100.6 . tcp . 443 . 0 : 10.244.7.7")));
}

#[test]
fn endpoint_refs_follow_updates() {
    use weir_proxy::nft::EndpointRefs;
    let (v1, v2) = (load("v1"), load("v2"));
    let v3 = with_more_web_endpoints(&v2);
    let o = NftOptions::default();
    for (old, new) in [(&v1, &v2), (&v2, &v1), (&v2, &v3), (&v3, &v1)] {
        let mut refs = EndpointRefs::of(old, &o);
        refs.update(old, new, &old.diff(new).touched(), &o);
        assert_eq!(refs, EndpointRefs::of(new, &o));
    }
}

/// The full sync's encoded ruleset holds exactly the ruleset's elements: the same structure,
/// the sets the netlink path owns encoded (each element once, repeated keys dropped as the
/// ruleset drops them, the first in plan order), the others as values.
#[test]
fn encoded_ruleset_holds_the_rulesets_elements() {
    use weir_proxy::nft::netlink::RawElement;
    use weir_proxy::nft::{ruleset, ruleset_encoded};
    let o = NftOptions::default();
    let mut conflicting = load("v1");
    let one = conflicting
        .services
        .keys()
        .find(|k| k.name.as_ref() == "one")
        .unwrap()
        .clone();
    let mut dup = (*conflicting.services[&one]).clone();
    let mut key = one.clone();
    key.name = "one-copy".into();
    dup.cluster_endpoints[0].ip = "10.244.7.7".parse().unwrap();
    dup.frontends
        .retain(|f| f.kind == weir_model::FrontendKind::ExternalIp);
    conflicting.services.insert(key, dup.into());
    for (what, p) in [
        ("v1", load("v1")),
        ("v2", load("v2")),
        ("conflicting", conflicting),
    ] {
        let whole = ruleset(&p, &o);
        let (rs, encoded) = ruleset_encoded(&p, &o);
        assert_eq!(rs.chains, whole.chains, "{what}");
        assert_eq!(rs.decls, whole.decls, "{what}");
        assert_eq!(rs.refs, whole.refs, "{what}");
        let mut c1 = rs.conflicts.clone();
        let mut c2 = whole.conflicts.clone();
        c1.sort();
        c2.sort();
        assert_eq!(c1, c2, "{what}");
        assert_eq!(what == "conflicting", !c1.is_empty(), "{what}: {c1:?}");
        for (name, els) in &whole.elements {
            if whole.via_netlink(name) {
                assert!(!rs.elements.contains_key(name), "{what} {name}");
                let mut want: Vec<RawElement> = els.iter().map(RawElement::of).collect();
                let mut got: Vec<RawElement> = encoded[name]
                    .iter()
                    .map(|a| RawElement::of_encoded(a).unwrap())
                    .collect();
                want.sort();
                got.sort();
                assert_eq!(got, want, "{what} {name}");
            } else {
                assert_eq!(rs.elements.get(name), Some(els), "{what} {name}");
            }
        }
        assert!(
            encoded.keys().all(|n| whole.elements.contains_key(n)),
            "{what}"
        );
    }
}
