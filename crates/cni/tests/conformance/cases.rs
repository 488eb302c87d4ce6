//! The cases: what the CNI spec (1.1) or the reference plugins' documented configuration asks of a
//! bridge plugin, one behaviour each. `expected` is the column the table prints.

use serde_json::{json, Value};

use super::{ensure, first_ip, pod_eth0, pod_mac, short, Ctx, Invocation, BRIDGE, SUBNET_PREFIX};

type Check = Box<dyn Fn(&Ctx) -> Result<(), String> + Send + Sync>;

pub struct Case {
    pub name: String,
    pub expected: String,
    pub check: Check,
}

fn case(
    name: impl Into<String>,
    expected: impl Into<String>,
    check: impl Fn(&Ctx) -> Result<(), String> + Send + Sync + 'static,
) -> Case {
    Case {
        name: name.into(),
        expected: expected.into(),
        check: Box::new(check),
    }
}

pub const VERSIONS: &[&str] = &["0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn at_least(v: &str, min: &str) -> bool {
    let parts = |s: &str| -> Vec<u32> { s.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parts(v) >= parts(min)
}

const NET: &str = "conformance";

pub fn all() -> Vec<Case> {
    let mut cases = Vec::new();
    for &v in VERSIONS {
        cases.extend(per_version(v));
    }
    cases.extend(probes());
    cases.extend(requested_addresses());
    cases.extend(reference_keys());
    cases
}

// ---------------------------------------------------------------------------------------------
// verbs × versions

fn per_version(v: &'static str) -> Vec<Case> {
    let mut cases = vec![
        case(
            format!("VERSION, cniVersion {v}"),
            format!("success; supportedVersions lists {v}; reply's cniVersion is {v}"),
            move |ctx| {
                let stdin = json!({ "cniVersion": v }).to_string();
                let r = ctx.invoke(&Invocation::new("VERSION", stdin.as_bytes())).ok()?;
                let listed = r["supportedVersions"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == v));
                ensure(listed, || format!("{v} not in supportedVersions {}", r["supportedVersions"]))?;
                ensure(r["cniVersion"] == v, || format!("answered cniVersion {}", r["cniVersion"]))
            },
        ),
        case(
            format!("ADD, cniVersion {v}"),
            if at_least(v, "1.0.0") {
                format!("success; result cniVersion {v}, no ips[].version; the address is on the pod's eth0")
            } else {
                format!("success; result cniVersion {v} with ips[].version \"4\"; the address is on the pod's eth0")
            },
            move |ctx| {
                let (pod, r) = ctx.add(&ctx.conf(v, |_| {}), "add1")?;
                ensure(r["cniVersion"] == v, || format!("result cniVersion {}", r["cniVersion"]))?;
                let has_version = r["ips"][0].get("version").is_some();
                ensure(has_version != at_least(v, "1.0.0"), || {
                    format!("ips[0] is {} for {v}", r["ips"][0])
                })?;
                let ip = first_ip(&r)?;
                ensure(ip.starts_with(SUBNET_PREFIX), || format!("{ip} not in the subnet"))?;
                let seen = pod_eth0(&pod).map(|(a, _)| a);
                ensure(seen.as_deref() == Some(ip.as_str()), || format!("pod eth0 has {seen:?}, result says {ip}"))
            },
        ),
        case(
            format!("DEL, cniVersion {v}"),
            "success; the address is released and the pod's eth0 removed; a second DEL succeeds too",
            move |ctx| {
                let conf = ctx.conf(v, |_| {});
                let (pod, r) = ctx.add(&conf, "del1")?;
                let conf = with_prev(&conf, &r, v);
                ctx.run("DEL", &conf, "del1", Some(&pod)).ok().map_err(|e| format!("DEL {e}"))?;
                ensure(ctx.allocated(NET).is_empty(), || format!("left allocated: {:?}", ctx.allocated(NET)))?;
                // A plugin may finish deleting the veth after DEL returns (weir does, in a child).
                settle(|| pod_eth0(&pod).is_none()).map_err(|_| "pod eth0 still there after 3 s".to_string())?;
                ctx.run("DEL", &conf, "del1", Some(&pod)).ok().map_err(|e| format!("second DEL {e}"))?;
                Ok(())
            },
        ),
    ];
    cases.push(if at_least(v, "0.4.0") {
        case(
            format!("CHECK, cniVersion {v}"),
            "success with ADD's result as prevResult",
            move |ctx| {
                let conf = ctx.conf(v, |_| {});
                let (pod, r) = ctx.add(&conf, "chk1")?;
                ctx.run("CHECK", &with_prev(&conf, &r, v), "chk1", Some(&pod))
                    .ok()
                    .map(drop)
            },
        )
    } else {
        case(
            format!("CHECK, cniVersion {v}"),
            "error (CHECK exists from 0.4.0)",
            move |ctx| {
                let conf = ctx.conf(v, |_| {});
                let (pod, r) = ctx.add(&conf, "chk1")?;
                ctx.run("CHECK", &with_prev(&conf, &r, v), "chk1", Some(&pod))
                    .error_code()
                    .map(drop)
            },
        )
    });
    for verb in ["GC", "STATUS"] {
        cases.push(if at_least(v, "1.1.0") {
            case(format!("{verb}, cniVersion {v}"), "success", move |ctx| {
                let conf = ctx.conf(v, |c| {
                    if verb == "GC" {
                        c["cni.dev/valid-attachments"] = json!([]);
                    }
                });
                ctx.run(verb, &conf, "", None).ok().map(drop)
            })
        } else {
            case(
                format!("{verb}, cniVersion {v}"),
                format!("error ({verb} exists from 1.1.0)"),
                move |ctx| {
                    let conf = ctx.conf(v, |c| {
                        if verb == "GC" {
                            c["cni.dev/valid-attachments"] = json!([]);
                        }
                    });
                    ctx.run(verb, &conf, "", None).error_code().map(drop)
                },
            )
        });
    }
    cases
}

/// The configuration a runtime sends after ADD (CHECK, DEL): with prevResult for versions that have it.
fn with_prev(conf: &Value, result: &Value, v: &str) -> Value {
    let mut c = conf.clone();
    if at_least(v, "0.4.0") {
        c["prevResult"] = result.clone();
    }
    c
}

// ---------------------------------------------------------------------------------------------
// the probes of issue 7 and other spec requirements

fn probes() -> Vec<Case> {
    let mut all = gc_probes();
    all.extend(lifecycle_probes());
    all.extend(input_probes());
    all
}

/// VERSION as libcni asks it, and GC.
fn gc_probes() -> Vec<Case> {
    vec![
        case(
            "VERSION with libcni's dummy CNI_NETNS/IFNAME/PATH (podman)",
            "success: VERSION needs only CNI_COMMAND",
            |ctx| {
                let stdin = json!({"cniVersion": "1.0.0"}).to_string();
                let mut inv = Invocation::new("VERSION", stdin.as_bytes());
                // What libcni's invoke.GetVersionInfo sets, so that old skel-based plugins pass.
                inv.extra_env = &[
                    ("CNI_NETNS", "dummy"),
                    ("CNI_IFNAME", "dummy"),
                    ("CNI_PATH", "dummy"),
                ];
                ctx.invoke(&inv).ok().map(drop)
            },
        ),
        case(
            "GC keeps valid attachments, releases the rest",
            "success; the listed attachment keeps address and veth, the other loses both",
            |ctx| {
                let conf = ctx.conf("1.1.0", |_| {});
                let (_, keep) = ctx.add(&conf, "keep")?;
                let (_, gone) = ctx.add(&conf, "gone")?;
                let (keep, gone) = (first_ip(&keep)?, first_ip(&gone)?);
                let mut gc = conf.clone();
                gc["cni.dev/valid-attachments"] =
                    json!([{"containerID": "keep", "ifname": "eth0"}]);
                ctx.run("GC", &gc, "", None).ok()?;
                ensure(ctx.allocated(NET) == vec![keep.clone()], || {
                    format!(
                        "allocated after GC: {:?} (kept {keep}, stale {gone})",
                        ctx.allocated(NET)
                    )
                })?;
                settle(|| ctx.bridge_ports(BRIDGE) == 1).map_err(|_| {
                    format!("{} bridge ports after GC, want 1", ctx.bridge_ports(BRIDGE))
                })
            },
        ),
        case(
            "GC with cni.dev/attachments (libcni >= 1.2.3)",
            "success: keys under cni.dev/ are reserved and accepted",
            |ctx| {
                let conf = ctx.conf("1.1.0", |_| {});
                let (_, r) = ctx.add(&conf, "att1")?;
                let mut gc = conf.clone();
                let list = json!([{"containerID": "att1", "ifname": "eth0"}]);
                gc["cni.dev/valid-attachments"] = list.clone();
                gc["cni.dev/attachments"] = list;
                ctx.run("GC", &gc, "", None).ok()?;
                let ip = first_ip(&r)?;
                ensure(ctx.allocated(NET) == vec![ip.clone()], || {
                    format!("GC released the valid {ip}")
                })
            },
        ),
        case(
            "GC without cni.dev/valid-attachments",
            "error; nothing released",
            |ctx| {
                let conf = ctx.conf("1.1.0", |_| {});
                let (_, r) = ctx.add(&conf, "nolist")?;
                let run = ctx.run("GC", &conf, "", None);
                let ip = first_ip(&r)?;
                ensure(ctx.allocated(NET) == vec![ip.clone()], || {
                    format!("GC released {ip}")
                })?;
                run.error_code().map(drop)
            },
        ),
        case(
            "GC of another network on the same node",
            "success; this network's pod keeps its address and veth",
            |ctx| {
                let mine = ctx.named_conf("netb", "1.1.0", |c| c["bridge"] = "cnfb".into());
                let (pod, r) = ctx.add(&mine, "podb")?;
                let other = ctx.named_conf("neta", "1.1.0", |c| {
                    c["bridge"] = "cnfa".into();
                    c["ipam"]["ranges"] = json!([[{"subnet": "10.99.1.0/24"}]]);
                    c["cni.dev/valid-attachments"] = json!([]);
                });
                ctx.run("GC", &other, "", None).ok()?;
                let ip = first_ip(&r)?;
                ensure(ctx.allocated("netb") == vec![ip.clone()], || {
                    format!("netb lost {ip}")
                })?;
                ensure(ctx.bridge_ports("cnfb") == 1, || {
                    "netb's veth was deleted".into()
                })?;
                ensure(pod_eth0(&pod).is_some(), || "netb's pod lost eth0".into())
            },
        ),
    ]
}

/// ADD, DEL and CHECK where the pod, its namespace or its interface is not as expected.
fn lifecycle_probes() -> Vec<Case> {
    vec![
        case(
            "ADD twice, same container ID and ifname",
            "second ADD fails; the first attachment is unchanged",
            |ctx| {
                let conf = ctx.conf("1.0.0", |_| {});
                let (pod, _) = ctx.add(&conf, "twice")?;
                let before = pod_eth0(&pod);
                let second = ctx.run("ADD", &conf, "twice", Some(&pod));
                let after = pod_eth0(&pod);
                ensure(before == after, || {
                    "the pod's eth0 was rebuilt (new MAC)".to_string()
                })?;
                ensure(ctx.allocated(NET).len() == 1, || {
                    format!("allocated: {:?}", ctx.allocated(NET))
                })?;
                second.error_code().map(drop)
            },
        ),
        case(
            "ADD with a FIFO as CNI_NETNS",
            "error within seconds (no hang), nothing allocated",
            |ctx| {
                let fifo = ctx.data_dir().join("fifo");
                let made = std::process::Command::new("mkfifo").arg(&fifo).status();
                ensure(made.is_ok_and(|s| s.success()), || "mkfifo failed".into())?;
                let stdin = ctx.conf("1.0.0", |_| {}).to_string();
                let mut inv =
                    Invocation::new("ADD", stdin.as_bytes()).attachment("fifo", Some(&fifo));
                // Checking the file type is instant; opening a FIFO blocks until a writer comes.
                inv.timeout = std::time::Duration::from_secs(5);
                let run = ctx.invoke(&inv);
                run.error_code()?;
                ensure(ctx.allocated(NET).is_empty(), || {
                    format!("allocated: {:?}", ctx.allocated(NET))
                })
            },
        ),
        case(
            "ADD with a netns that does not exist",
            "error, nothing allocated",
            |ctx| {
                let conf = ctx.conf("1.0.0", |_| {});
                let missing = ctx.data_dir().join("no-such-netns");
                ctx.run("ADD", &conf, "nons", Some(&missing)).error_code()?;
                ensure(ctx.allocated(NET).is_empty(), || {
                    format!("allocated: {:?}", ctx.allocated(NET))
                })
            },
        ),
        case(
            "DEL after the netns is gone",
            "success; the address and host veth are released",
            |ctx| {
                let conf = ctx.conf("1.0.0", |_| {});
                let (pod, r) = ctx.add(&conf, "gonens")?;
                ctx.delete_pod(&pod);
                ctx.run("DEL", &with_prev(&conf, &r, "1.0.0"), "gonens", Some(&pod))
                    .ok()?;
                ensure(ctx.allocated(NET).is_empty(), || {
                    format!("allocated: {:?}", ctx.allocated(NET))
                })?;
                settle(|| ctx.bridge_ports(BRIDGE) == 0).map_err(|_| "host veth left".into())
            },
        ),
        case(
            "DEL without CNI_NETNS (ctr's DEL)",
            "success; the address is released",
            |ctx| {
                let conf = ctx.conf("1.0.0", |_| {});
                let (_, r) = ctx.add(&conf, "nonetns")?;
                ctx.run("DEL", &with_prev(&conf, &r, "1.0.0"), "nonetns", None)
                    .ok()?;
                ensure(ctx.allocated(NET).is_empty(), || {
                    format!("allocated: {:?}", ctx.allocated(NET))
                })
            },
        ),
        case("DEL of a container never added", "success", |ctx| {
            let conf = ctx.conf("1.0.0", |_| {});
            let pod = ctx.pod();
            ctx.run("DEL", &conf, "never", Some(&pod)).ok().map(drop)
        }),
        case(
            "CHECK after the pod's interface was deleted",
            "error",
            |ctx| {
                let conf = ctx.conf("1.0.0", |_| {});
                let (pod, r) = ctx.add(&conf, "chkgone")?;
                let name = pod.file_name().unwrap().to_string_lossy().into_owned();
                let _ = std::process::Command::new("ip")
                    .args(["-n", &name, "link", "del", "eth0"])
                    .status();
                ctx.run(
                    "CHECK",
                    &with_prev(&conf, &r, "1.0.0"),
                    "chkgone",
                    Some(&pod),
                )
                .error_code()
                .map(drop)
            },
        ),
    ]
}

/// STATUS, and what the plugin is handed: versions, syntax, size.
fn input_probes() -> Vec<Case> {
    vec![
        case(
            "STATUS with the range exhausted",
            "error code 50 (cannot serve ADDs)",
            |ctx| {
                let conf = ctx.conf("1.1.0", |c| {
                    c["ipam"]["ranges"] = json!([[{"subnet": format!("{SUBNET_PREFIX}.0/24"),
                        "rangeStart": format!("{SUBNET_PREFIX}.10"), "rangeEnd": format!("{SUBNET_PREFIX}.10")}]]);
                });
                ctx.add(&conf, "only")?;
                let code = ctx.run("STATUS", &conf, "", None).error_code()?;
                ensure(code == 50, || format!("code {code}"))
            },
        ),
        case("unsupported cniVersion 9.9.9", "error code 1", |ctx| {
            let conf = ctx.conf("9.9.9", |_| {});
            let pod = ctx.pod();
            let code = ctx.run("ADD", &conf, "v999", Some(&pod)).error_code()?;
            ensure(code == 1, || format!("code {code}"))
        }),
        case(
            "configuration that is not JSON",
            "error code 6 (decode)",
            |ctx| {
                let pod = ctx.pod();
                let inv = Invocation::new("ADD", b"{\"cniVersion\": \"1.0.0\",")
                    .attachment("badjson", Some(&pod));
                let code = ctx.invoke(&inv).error_code()?;
                ensure(code == 6, || format!("code {code}"))
            },
        ),
        case(
            "10 MB value under an unknown key",
            "ignored, or an error whose reply stays under 4 KiB",
            |ctx| {
                // Spliced in as text: serde on 10 MB is slow in a debug build.
                let conf = ctx.conf("1.0.0", |_| {}).to_string();
                let stdin = format!(
                    "{{\"frobnicate\":\"{}\",{}",
                    "x".repeat(10 << 20),
                    &conf[1..]
                );
                let pod = ctx.pod();
                let run = ctx.invoke(
                    &Invocation::new("ADD", stdin.as_bytes()).attachment("huge", Some(&pod)),
                );
                if run.success() {
                    return Ok(());
                }
                ensure(run.stdout.len() < 4096, || {
                    format!("error reply is {} bytes", run.stdout.len())
                })?;
                run.error_code().map(drop)
            },
        ),
    ]
}

/// Polls `cond` for up to three seconds (some plugins delete veths in the background).
fn settle(mut cond: impl FnMut() -> bool) -> Result<(), ()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while !cond() {
        if std::time::Instant::now() > deadline {
            return Err(());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// requested addresses and MACs

const WANT_IP: &str = "10.99.0.77";
const WANT_MAC: &str = "02:42:0a:63:00:4d";

fn requested_addresses() -> Vec<Case> {
    fn wants_ip(ctx: &Ctx, conf: Value, cni_args: Option<&str>) -> Result<(), String> {
        let pod = ctx.pod();
        let stdin = conf.to_string();
        let mut inv = Invocation::new("ADD", stdin.as_bytes()).attachment("req", Some(&pod));
        inv.cni_args = cni_args;
        let r = ctx.invoke(&inv).ok()?;
        let ip = first_ip(&r)?;
        ensure(ip == WANT_IP, || format!("got {ip}"))
    }
    fn wants_mac(ctx: &Ctx, conf: Value, cni_args: Option<&str>) -> Result<(), String> {
        let pod = ctx.pod();
        let stdin = conf.to_string();
        let mut inv = Invocation::new("ADD", stdin.as_bytes()).attachment("req", Some(&pod));
        inv.cni_args = cni_args;
        let r = ctx.invoke(&inv).ok()?;
        let seen = pod_eth0(&pod).map(|(_, m)| m);
        ensure(seen.as_deref() == Some(WANT_MAC), || {
            format!(
                "pod eth0 has another MAC ({})",
                if seen.is_some() { "random" } else { "none" }
            )
        })?;
        ensure(pod_mac(&r).as_deref() == Some(WANT_MAC), || {
            format!("result MAC {:?}", pod_mac(&r))
        })
    }
    vec![
        case(
            "requested IP: runtimeConfig.ips (capability ips)",
            format!("ADD gets {WANT_IP}"),
            |ctx| {
                let conf = ctx.conf("1.0.0", |c| {
                    c["capabilities"] = json!({"ips": true});
                    c["runtimeConfig"] = json!({"ips": [format!("{WANT_IP}/24")]});
                });
                wants_ip(ctx, conf, None)
            },
        ),
        case(
            "requested IP: args.cni.ips",
            format!("ADD gets {WANT_IP}"),
            |ctx| {
                let conf = ctx.conf("1.0.0", |c| c["args"] = json!({"cni": {"ips": [WANT_IP]}}));
                wants_ip(ctx, conf, None)
            },
        ),
        case(
            "requested IP: CNI_ARGS IP=",
            format!("ADD gets {WANT_IP}"),
            |ctx| {
                wants_ip(
                    ctx,
                    ctx.conf("1.0.0", |_| {}),
                    Some(&format!("IgnoreUnknown=1;IP={WANT_IP}")),
                )
            },
        ),
        case(
            "requested MAC: runtimeConfig.mac (capability mac)",
            format!("pod eth0 and the result have {WANT_MAC}"),
            |ctx| {
                let conf = ctx.conf("1.0.0", |c| {
                    c["capabilities"] = json!({"mac": true});
                    c["runtimeConfig"] = json!({"mac": WANT_MAC});
                });
                wants_mac(ctx, conf, None)
            },
        ),
        case(
            "requested MAC: CNI_ARGS MAC=",
            format!("pod eth0 and the result have {WANT_MAC}"),
            |ctx| {
                wants_mac(
                    ctx,
                    ctx.conf("1.0.0", |_| {}),
                    Some(&format!("IgnoreUnknown=1;MAC={WANT_MAC}")),
                )
            },
        ),
        case(
            "requested IP outside the ranges",
            "error, nothing allocated",
            |ctx| {
                let conf = ctx.conf("1.0.0", |c| {
                    c["args"] = json!({"cni": {"ips": ["10.98.0.5"]}})
                });
                let pod = ctx.pod();
                ctx.run("ADD", &conf, "outside", Some(&pod)).error_code()?;
                ensure(ctx.allocated(NET).is_empty(), || {
                    format!("allocated: {:?}", ctx.allocated(NET))
                })
            },
        ),
        case(
            "requested IP already taken",
            "error; the holder keeps it",
            |ctx| {
                let plain = ctx.conf("1.0.0", |_| {});
                let (_, r) = ctx.add(&plain, "holder")?;
                let taken = first_ip(&r)?;
                let conf = ctx.conf("1.0.0", |c| {
                    c["args"] = json!({"cni": {"ips": [taken.clone()]}})
                });
                let pod = ctx.pod();
                ctx.run("ADD", &conf, "taker", Some(&pod)).error_code()?;
                ensure(ctx.allocated(NET) == vec![taken], || {
                    format!("allocated: {:?}", ctx.allocated(NET))
                })
            },
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// the reference plugins' configuration keys

/// A key is honoured (ADD succeeds and `verify` holds), or refused with an error that names it and
/// is not the generic unknown-key rejection (what an operator migrating a conflist needs).
fn honoured_or_named(
    ctx: &Ctx,
    key: &str,
    conf: Value,
    verify: impl FnOnce(&Ctx, &std::path::Path, &Value) -> Result<(), String>,
) -> Result<(), String> {
    let pod = ctx.pod();
    let run = ctx.run("ADD", &conf, "keys", Some(&pod));
    if run.success() {
        let r = run.ok()?;
        return verify(ctx, &pod, &r);
    }
    let msg = run.error_msg();
    // weir's generic rejections of keys it does not know are what issue 7 calls out.
    let generic = msg.contains("unsupported field") || msg.contains("unknown field");
    ensure(msg.contains(key) && !generic, || {
        format!("rejected: {}", short(&msg))
    })
}

fn ok_verify(_: &Ctx, _: &std::path::Path, _: &Value) -> Result<(), String> {
    Ok(())
}

fn reference_keys() -> Vec<Case> {
    const HONOURED: &str =
        "ADD succeeds with the key honoured, or fails naming the key as not implemented";
    const ACCEPTED: &str = "ADD succeeds (key accepted; its effect is not checked), or fails naming the key as not implemented";
    vec![
        case(
            "bridge key promiscMode",
            format!("{HONOURED}: the bridge is promiscuous"),
            |ctx| {
                let conf = ctx.conf("1.0.0", |c| c["promiscMode"] = true.into());
                honoured_or_named(ctx, "promiscMode", conf, |ctx, _, _| {
                    let out = ctx.node.sh(&format!("ip -d link show {BRIDGE}"));
                    ensure(
                        out.contains("PROMISC") || out.contains("promiscuity 1"),
                        || "bridge not promiscuous".into(),
                    )
                })
            },
        ),
        case("bridge key forceAddress", ACCEPTED, |ctx| {
            let conf = ctx.conf("1.0.0", |c| c["forceAddress"] = true.into());
            honoured_or_named(ctx, "forceAddress", conf, ok_verify)
        }),
        case("bridge key vlan", ACCEPTED, |ctx| {
            let conf = ctx.conf("1.0.0", |c| c["vlan"] = 100.into());
            honoured_or_named(ctx, "vlan", conf, ok_verify)
        }),
        case("bridge key ipMasqBackend", ACCEPTED, |ctx| {
            let conf = ctx.conf("1.0.0", |c| {
                c["ipMasq"] = true.into();
                c["ipMasqBackend"] = "nftables".into();
            });
            honoured_or_named(ctx, "ipMasqBackend", conf, ok_verify)
        }),
        case(
            "bridge key disableContainerInterface",
            format!("{HONOURED}: the pod's eth0 is left down"),
            |ctx| {
                let conf = ctx.conf("1.0.0", |c| c["disableContainerInterface"] = true.into());
                honoured_or_named(ctx, "disableContainerInterface", conf, |_, pod, _| {
                    let name = pod.file_name().unwrap().to_string_lossy().into_owned();
                    let out = std::process::Command::new("ip")
                        .args(["-n", &name, "-o", "link", "show", "eth0"])
                        .output()
                        .map_err(|e| e.to_string())?;
                    let line = String::from_utf8_lossy(&out.stdout).into_owned();
                    let flags = line.split(['<', '>']).nth(1).unwrap_or("");
                    ensure(!flags.split(',').any(|f| f == "UP"), || {
                        format!("eth0 is up: <{flags}>")
                    })
                })
            },
        ),
        case("bridge key macspoofchk", ACCEPTED, |ctx| {
            let conf = ctx.conf("1.0.0", |c| c["macspoofchk"] = true.into());
            honoured_or_named(ctx, "macspoofchk", conf, ok_verify)
        }),
        case("key disableCheck", ACCEPTED, |ctx| {
            let conf = ctx.conf("1.0.0", |c| c["disableCheck"] = true.into());
            honoured_or_named(ctx, "disableCheck", conf, ok_verify)
        }),
        case(
            "host-local subnet/gateway/rangeStart/rangeEnd form",
            format!("{HONOURED}: address {SUBNET_PREFIX}.100, gateway {SUBNET_PREFIX}.254"),
            |ctx| {
                let conf = ctx.conf("1.0.0", |c| {
                    c["ipam"] = json!({
                        "type": "host-local",
                        "subnet": format!("{SUBNET_PREFIX}.0/24"),
                        "gateway": format!("{SUBNET_PREFIX}.254"),
                        "rangeStart": format!("{SUBNET_PREFIX}.100"),
                        "rangeEnd": format!("{SUBNET_PREFIX}.110"),
                        "dataDir": ctx.data_dir(),
                    });
                });
                honoured_or_named(ctx, "rangeStart", conf, |_, _, r| {
                    let ip = first_ip(r)?;
                    ensure(ip == format!("{SUBNET_PREFIX}.100"), || format!("got {ip}"))?;
                    let gw = &r["ips"][0]["gateway"];
                    ensure(*gw == format!("{SUBNET_PREFIX}.254"), || {
                        format!("gateway {gw}")
                    })
                })
            },
        ),
        case(
            "host-local key resolvConf",
            format!("{HONOURED}: result dns.nameservers from the file"),
            |ctx| {
                let file = ctx.data_dir().join("resolv.conf");
                std::fs::write(&file, "nameserver 10.99.9.9\nsearch example.test\n").unwrap();
                let conf = ctx.conf("1.0.0", |c| c["ipam"]["resolvConf"] = json!(file));
                honoured_or_named(ctx, "resolvConf", conf, |_, _, r| {
                    let ns = &r["dns"]["nameservers"];
                    ensure(
                        ns.as_array()
                            .is_some_and(|a| a.iter().any(|x| x == "10.99.9.9")),
                        || format!("dns {}", r["dns"]),
                    )
                })
            },
        ),
        case(
            "ipam type host-local",
            "success; an address from the subnet",
            |ctx| {
                let conf = ctx.conf("1.0.0", |c| c["ipam"]["type"] = "host-local".into());
                let (_, r) = ctx.add(&conf, "hl")?;
                let ip = first_ip(&r)?;
                ensure(ip.starts_with(SUBNET_PREFIX), || format!("got {ip}"))
            },
        ),
    ]
}
