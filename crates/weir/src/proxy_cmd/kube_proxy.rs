//! kube-proxy 1.37 beside `weir proxy`: each of kube-proxy's flags, KubeProxyConfiguration
//! (`kubeproxy.config.k8s.io/v1alpha1`, its only version) fields, feature gates, the
//! Service/EndpointSlice/Node fields it reads and its metrics, with what weir does with it —
//! in one list, [`ROWS`]. The command line takes every kube-proxy flag (those weir has no
//! flag of its own for are added from the list, [`KubeProxyOnlyFlags`]), the configuration
//! loader walks a file against the list ([`check_config`]), and a test checks docs/proxy.md's
//! table against it, row by row.
//!
//! Three classes ([`Class`]): the same meaning as kube-proxy's; accepted but different (or
//! without effect), said in a notice that names it; refused by name, saying why and what weir
//! offers instead (exit code 2, as a usage error). A row's `harmless` values are those with
//! which the option asks for what weir does anyway: accepted without a word. Nothing a
//! kube-proxy user writes is dropped silently, and nothing kube-proxy 1.37 accepts is an
//! "unexpected argument".

use std::collections::BTreeMap;

use crate::foreign_flags::{differs, find_in, refused, row, same, OnlyFlags, Table};
pub use crate::foreign_flags::{parse_go_bool, Class, Findings, Kind, Refused, Row};

const fn gate(name: &'static [&'static str], class: Class, text: &'static str) -> Row {
    row(Kind::Gate, name, class, text)
}

const fn api(names: &'static [&'static str], class: Class, text: &'static str) -> Row {
    row(Kind::Api, names, class, text)
}

const fn metric(name: &'static [&'static str], class: Class, text: &'static str) -> Row {
    row(Kind::Metric, name, class, text)
}

/// kube-proxy 1.37 (`cmd/kube-proxy/app/options.go` with component-base's logging flags,
/// `k8s.io/kube-proxy/config/v1alpha1`, the feature gates kube-proxy's code reads,
/// `pkg/proxy/{servicechangetracker,serviceport,endpointslicecache,topology}.go`,
/// `pkg/proxy/metrics/metrics.go`) and what weir does with each.
pub static ROWS: &[Row] = &[
    // The command and the configuration file.
    differs(&["--config"], "read as kube-proxy reads it, but flags given beside it win over its fields (kube-proxy 1.37 ignores most flags when --config is given)")
        .applied()
        .tests(&["config_file_applies_and_flags_win"]),
    same(&["apiVersion", "kind"], "`kubeproxy.config.k8s.io/v1alpha1` (kube-proxy 1.37's only version) and `KubeProxyConfiguration`; another kind is refused")
        .tests(&["config_errors_name_the_field"]),
    refused(&["--write-config-to"], "weir writes no configuration file; `weir proxy --validate` prints the settings it would run with")
        .harmless(&[""])
        .tests(&["nodeport_keywords_and_refusals_name_the_value"]),
    same(&["--cleanup"], "removes the rules of every weir mode (or of --proxy-mode) and exits; also `weir proxy cleanup`")
        .boolean()
        .tests(&["cleanup_leaves_no_kube_chain", "kube_proxy_flags_map_onto_weirs_settings"]),
    differs(&["--feature-gates", "featureGates"], "gate by gate as the gate rows say; a name weir does not know is accepted with a notice and no effect (kube-proxy 1.37 knows every Kubernetes gate and refuses other names)")
        .applied()
        .tests(&["feature_gates_weir_has_pass_and_the_others_are_named"]),
    differs(&["--help", "-h"], "weir's help: weir's flags and the kube-proxy flags weir applies; those it only notices or refuses are not listed (its last line points to this table)")
        .applied(),
    differs(&["--version"], "prints weir's version line and exits (`=raw` too); `=vX.Y.Z` (report another version) is refused")
        .applied()
        .tests(&["kube_proxy_flags_map_onto_weirs_settings"]),
    // The API server.
    same(&["--kubeconfig", "clientConnection.kubeconfig"], "the API server and credentials to watch (the flag wins); with neither it nor --master, the in-cluster service account")
        .tests(&["client_connection_kubeconfig_comes_from_the_config_file_and_the_flag_wins"]),
    same(&["--master"], "overrides the kubeconfig's server")
        .tests(&["the_api_source_is_chosen_as_kube_proxy_finds_its_server"]),
    differs(&["--kube-api-content-type", "clientConnection.contentType", "clientConnection.acceptContentTypes"], "no effect: weir's API client always asks for JSON")
        .harmless(&[""]),
    differs(&["--kube-api-qps", "--kube-api-burst", "clientConnection.qps", "clientConnection.burst"], "no effect: weir's API source makes one list and one long watch per kind, with no client-side rate limit")
        .tests(&["each_class_does_what_it_says", "client_connection_kubeconfig_comes_from_the_config_file_and_the_flag_wins"]),
    differs(&["--config-sync-period", "configSyncPeriod"], "no effect: weir's watches have no periodic re-delivery of cached objects (an informer resync changes no rule in kube-proxy either)"),
    // The node and the servers.
    same(&["--hostname-override", "hostnameOverride"], "this node's name (lowercased; the flag wins)")
        .tests(&["kube_proxy_flags_map_onto_weirs_settings"]),
    same(&["--bind-address", "bindAddress"], "this node's primary IP of its family (the other family's from the Node object); `0.0.0.0` and `::` leave both to the Node object; an IPv6 one makes the /healthz and /metrics defaults `[::]:10256` and `[::1]:10249`")
        .tests(&["node_ips_override_the_node_objects_per_family", "kube_proxy_flags_map_onto_weirs_settings"]),
    same(&["--healthz-bind-address", "healthzBindAddress", "--metrics-bind-address", "metricsBindAddress"], "IP:port of /healthz and /livez (default `0.0.0.0:10256`) and of /metrics (default `127.0.0.1:10249`); an IP alone takes the port of --healthz-port / --metrics-port; the flag empty (kube-proxy's \"set empty to disable\") or `0` turns the server off")
        .tests(&["kube_proxy_flags_map_onto_weirs_settings"]),
    same(&["--healthz-port", "--metrics-port"], "(deprecated in kube-proxy) the port for a bind address without one; 0 turns the server off")
        .tests(&["kube_proxy_flags_map_onto_weirs_settings"]),
    differs(&["--bind-address-hard-fail", "bindAddressHardFail"], "`false` (kube-proxy's default): weir exits when it cannot bind the /healthz or /metrics address all the same (kube-proxy logs it and runs on)")
        .boolean()
        .harmless(&["true"]),
    differs(&["--profiling", "enableProfiling"], "no effect: weir serves no /debug/pprof (profile it with perf)")
        .boolean()
        .harmless(&["false"])
        .tests(&["each_class_does_what_it_says"]),
    differs(&["--show-hidden-metrics-for-version", "showHiddenMetricsForVersion"], "no effect: weir hides no metrics")
        .harmless(&[""]),
    refused(&["--init-only"], "weir has no separate privileged start: it sets the sysctls it needs while it runs, so run `weir proxy` itself with the privileges kube-proxy's init step had")
        .boolean()
        .harmless(&["false"])
        .tests(&["nodeport_keywords_and_refusals_name_the_value"]),
    differs(&["--oom-score-adj", "oomScoreAdj"], "written to /proc/self/oom_score_adj when given (a failure is logged, as kube-proxy does); unset, weir leaves it (kube-proxy writes -999)")
        .applied()
        .tests(&["kube_proxy_flags_map_onto_weirs_settings"]),
    // Modes.
    differs(&["--proxy-mode", "mode"], "`iptables`, `ipvs` and `nftables` as kube-proxy; unset or empty means `nftables` (kube-proxy: `iptables`); `userspace` is weir's own; `kernelspace` (Windows) is refused")
        .applied()
        .tests(&["config_file_applies_and_flags_win", "config_errors_name_the_field"]),
    differs(&["--iptables-sync-period", "iptables.syncPeriod", "nftables.syncPeriod", "--ipvs-sync-period", "ipvs.syncPeriod"], "weir's --sync-period (default 30 s), taken as kube-proxy takes it: `--iptables-sync-period` outside ipvs mode, `--ipvs-sync-period` in it, the file's `nftables.`, `ipvs.` or (other modes) `iptables.` section; --sync-period wins. Every period weir checks that the kernel still holds its rules and syncs in full if not, where kube-proxy runs a (partial) sync each period")
        .applied()
        .tests(&["kube_proxy_flags_map_onto_weirs_settings", "ipvs_mode_takes_its_section_and_scheduler_flag"]),
    same(&["--iptables-min-sync-period", "iptables.minSyncPeriod", "nftables.minSyncPeriod", "--ipvs-min-sync-period", "ipvs.minSyncPeriod"], "weir's --min-sync-period (default 1 s), taken from the flags and sections the sync period is; --min-sync-period wins")
        .tests(&["kube_proxy_flags_map_onto_weirs_settings", "config_file_applies_and_flags_win"]),
    same(&["--iptables-masquerade-bit", "iptables.masqueradeBit", "nftables.masqueradeBit"], "the fwmark bit (0–31, default 14: 0x4000) that marks packets to masquerade: `iptables.` (and the flag) in iptables and ipvs modes, `nftables.` in nftables mode")
        .tests(&["kube_proxy_flags_map_onto_weirs_settings"]),
    same(&["--masquerade-all", "iptables.masqueradeAll", "nftables.masqueradeAll"], "masquerade everything sent to a service IP: `nftables.` in nftables mode, `iptables.` in the others (ipvs too)")
        .boolean()
        .tests(&["config_file_applies_and_flags_win", "kube_proxy_flags_map_onto_weirs_settings"]),
    differs(&["--iptables-localhost-nodeports", "iptables.localhostNodePorts"], "`true` (kube-proxy's default): weir's iptables mode serves NodePorts on 127.0.0.1 only when --nodeport-addresses names loopback (`localhost`, `127.0.0.0/8`), not by default")
        .boolean()
        .harmless(&["false"]),
    same(&["--ipvs-scheduler", "ipvs.scheduler"], "the IPVS scheduler (default `rr`); an unknown name is refused")
        .tests(&["ipvs_mode_takes_its_section_and_scheduler_flag"]),
    same(&["--ipvs-tcp-timeout", "--ipvs-tcpfin-timeout", "--ipvs-udp-timeout", "ipvs.tcpTimeout", "ipvs.tcpFinTimeout", "ipvs.udpTimeout"], "IPVS's connection timeouts (`ipvsadm --set`); 0 leaves the kernel's")
        .tests(&["ipvs_mode_takes_its_section_and_scheduler_flag", "kube_proxy_flags_map_onto_weirs_settings"]),
    same(&["--ipvs-exclude-cidrs", "ipvs.excludeCIDRs"], "virtual servers on these addresses are never deleted as stale")
        .tests(&["exclude_cidrs_protect_virtual_servers_from_deletion", "kube_proxy_flags_map_onto_weirs_settings"]),
    same(&["--ipvs-strict-arp", "ipvs.strictARP"], "ipvs mode sets `arp_ignore=1` and `arp_announce=2` for every interface")
        .boolean()
        .tests(&["strict_arp_sets_arp_ignore_and_arp_announce", "kube_proxy_flags_map_onto_weirs_settings"]),
    // Which traffic is the cluster's, which addresses serve NodePorts.
    same(&["--cluster-cidr", "clusterCIDR"], "the pods' CIDRs (one per family): other sources are masqueraded")
        .tests(&["config_file_applies_and_flags_win", "masquerade_all_and_no_cluster_cidr"]),
    refused(&["--detect-local-mode", "detectLocalMode"], "weir tells pod traffic by --cluster-cidr only (`ClusterCIDR`, the default); `NodeCIDR`, `BridgeInterface` and `InterfaceNamePrefix` are not implemented")
        .harmless(&["ClusterCIDR", ""])
        .tests(&["nodeport_keywords_and_refusals_name_the_value", "kube_proxys_no_op_fields_pass_silently_and_unknown_ones_are_named"]),
    differs(&["--pod-bridge-interface", "--pod-interface-name-prefix", "detectLocal.bridgeInterface", "detectLocal.interfaceNamePrefix"], "no effect: only the --detect-local-mode values weir refuses use it (kube-proxy ignores it under `ClusterCIDR` too)")
        .harmless(&[""]),
    differs(&["--nodeport-addresses", "nodePortAddresses"], "CIDRs and the keywords `primary`, `localhost` and `all`, unset meaning kube-proxy's per-mode default (iptables and ipvs: every local address; nftables: `primary`); `primary` cannot be combined with CIDRs or other keywords (refused)")
        .applied()
        .tests(&["nodeport_defaults_follow_kube_proxy_per_mode", "nodeport_addresses", "nodeport_keywords_and_refusals_name_the_value"]),
    // conntrack.
    differs(&["--conntrack-max-per-core", "--conntrack-min", "conntrack.maxPerCore", "conntrack.min"], "when either is given, nf_conntrack_max is raised to max(per core × CPUs, min) (at most 1048576) and the hash size to a quarter of it, as kube-proxy does (32768 per core and 131072 standing in for the other); unset, weir leaves both (kube-proxy always sets them); 0 per core leaves them")
        .applied()
        .tests(&["host_settings_follow_kube_proxy", "kube_proxy_flags_map_onto_weirs_settings"]),
    differs(&["--conntrack-tcp-timeout-established", "--conntrack-tcp-timeout-close-wait", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout", "--conntrack-udp-timeout-stream", "conntrack.tcpEstablishedTimeout", "conntrack.tcpCloseWaitTimeout", "conntrack.tcpBeLiberal", "conntrack.udpTimeout", "conntrack.udpStreamTimeout"], "the nf_conntrack sysctls, set when given as kube-proxy sets them (a zero timeout leaves one); unset, weir leaves them (kube-proxy sets established to 24 h and close-wait to 1 h)")
        .applied()
        .tests(&["host_settings_follow_kube_proxy", "kube_proxy_flags_map_onto_weirs_settings"]),
    // Logging.
    same(&["--logging-format", "logging.format"], "`text` or `json`, weir's --log-format")
        .tests(&["kube_proxy_flags_map_onto_weirs_settings"]),
    differs(&["-v", "--v", "logging.verbosity"], "maps onto weir's log levels: 0–1 info; 2–3 debug and 4–5 trace for weir's own crates; 6 and more also its libraries' debug (the API client's requests, as klog's 6+); RUST_LOG, when set, wins")
        .applied()
        .tests(&["verbosity_maps_onto_log_levels"]),
    differs(&["--vmodule", "logging.vmodule"], "no effect: its patterns name Go source files (RUST_LOG filters weir's by module)")
        .harmless(&[""]),
    differs(&["--log-flush-frequency", "logging.flushFrequency"], "no effect: weir writes each log line at once")
        .harmless(&["0", "0s", "5s"]),
    differs(&["--log-text-split-stream", "--log-json-split-stream", "logging.options.text.splitStream", "logging.options.json.splitStream"], "no effect: weir writes every log line to stderr")
        .boolean()
        .harmless(&["false"]),
    differs(&["--log-text-info-buffer-size", "--log-json-info-buffer-size", "logging.options.text.infoBufferSize", "logging.options.json.infoBufferSize"], "no effect: weir does not buffer log lines")
        .harmless(&["0", ""]),
    // Unused and Windows-only fields.
    same(&["portRange"], "no effect, as in kube-proxy 1.37 (it configured the userspace proxy kube-proxy no longer has)")
        .tests(&["kube_proxys_no_op_fields_pass_silently_and_unknown_ones_are_named"]),
    same(&["windowsRunAsService", "winkernel.networkName", "winkernel.sourceVip", "winkernel.enableDSR", "winkernel.rootHnsEndpointName", "winkernel.forwardHealthCheckVip"], "Windows only: no effect on Linux, as in kube-proxy on Linux")
        .tests(&["kube_proxys_no_op_fields_pass_silently_and_unknown_ones_are_named"]),
    // Feature gates (harmless: the value that is weir's behaviour).
    gate(&["AllowServiceExternalIPs"], Class::Refused, "`=false` (kube-proxy then programs no externalIPs): weir always programs Service externalIPs")
        .harmless(&["true"])
        .tests(&["feature_gates_weir_has_pass_and_the_others_are_named"]),
    gate(&["KubeProxyIPVS"], Class::Same, "`=false` makes weir refuse ipvs mode, as kube-proxy does")
        .applied()
        .tests(&["feature_gates_weir_has_pass_and_the_others_are_named"]),
    gate(&["KubeProxyNFTablesLocalhostNodePorts"], Class::Refused, "`=true`: weir's nftables mode serves no localhost NodePorts (its iptables mode does, with a loopback --nodeport-addresses)")
        .harmless(&["false"])
        .tests(&["feature_gates_weir_has_pass_and_the_others_are_named"]),
    gate(&["NFTablesNetlink"], Class::Differs, "`=false` (kube-proxy then drives nftables only through the nft tool): no effect; weir writes map elements over netlink and chains with `nft -f` either way")
        .harmless(&["true"]),
    gate(&["PreferSameTrafficDistribution"], Class::Refused, "`=false`: kube-proxy 1.37 refuses it too (GA, locked on); weir always honours `hints.forNodes`")
        .harmless(&["true"])
        .tests(&["topology_hints_and_fallbacks"]),
    gate(&["MultiCIDRServiceAllocator"], Class::Refused, "`=false`: kube-proxy 1.37 refuses it too (GA, locked on); weir does not watch ServiceCIDRs either way (see below)")
        .harmless(&["true"]),
    gate(&["WinDSR", "WinOverlay"], Class::Same, "Windows only: no effect on Linux, as in kube-proxy on Linux")
        .tests(&["feature_gates_weir_has_pass_and_the_others_are_named"]),
    gate(&["LoggingAlphaOptions", "LoggingBetaOptions", "ContextualLogging"], Class::Differs, "no effect on weir's logging"),
    gate(&["NativeHistograms"], Class::Differs, "no effect: weir's histograms have fixed buckets"),
    gate(&["ComponentFlagz", "ComponentStatusz"], Class::Differs, "no effect: weir serves no /flagz or /statusz"),
    // What kube-proxy reads of the objects it watches.
    api(&["Service label service.kubernetes.io/service-proxy-name", "EndpointSlice label service.kubernetes.io/headless"], Class::Same, "objects carrying them are not watched (kube-proxy's list selectors; a manifest directory is taken as written)")
        .tests(&["initial_lists_honour_kube_proxys_selectors_and_then_changes_stream"]),
    api(&["Service spec.type", "Service spec.clusterIP", "Service spec.clusterIPs"], Class::Same, "rules per family of `clusterIPs`; ExternalName, headless and IP-less Services get none")
        .tests(&["dual_stack_one_plan_per_family", "headless_external_name_and_ip_less_services_get_nothing"]),
    api(&["Service spec.ports"], Class::Same, "name, protocol (TCP, UDP, SCTP), port, nodePort")
        .tests(&["protocols_tcp_udp_sctp", "endpoints_merged_across_slices_deduplicated_and_matched_by_port_name"]),
    api(&["Service spec.clusterIPs, a port the Service lacks"], Class::Refused, "not rejected: kube-proxy's nftables mode rejects it; weir lets it follow the node's routes"),
    api(&["Service spec.sessionAffinity", "Service spec.sessionAffinityConfig.clientIP.timeoutSeconds"], Class::Same, "ClientIP affinity with its timeout (default 3 h)")
        .tests(&["session_affinity_client_ip"]),
    api(&["Service spec.externalIPs"], Class::Same, "served as frontends")
        .tests(&["external_ips_nftables", "load_balancer_ingress_external_ips_and_source_ranges"]),
    api(&["Service status.loadBalancer.ingress[].ip", "Service status.loadBalancer.ingress[].ipMode"], Class::Same, "VIP-mode (or unset) ingress IPs are served on the node; `ipMode: Proxy` ones are left to the load balancer")
        .tests(&["load_balancer_ingress_external_ips_and_source_ranges"]),
    api(&["Service spec.loadBalancerSourceRanges"], Class::Same, "only these sources reach the load balancer IPs (the node too when it is in them)")
        .tests(&["load_balancer_ingress_external_ips_and_source_ranges"]),
    api(&["Service spec.externalTrafficPolicy"], Class::Same, "`Local`: local endpoints only from outside, client address kept, pods and the node short-circuited to every endpoint")
        .tests(&["external_traffic_policy_local", "services_nftables"]),
    api(&["Service spec.internalTrafficPolicy"], Class::Same, "`Local`: the node's own endpoints only")
        .tests(&["internal_traffic_policy_local", "internal_traffic_policy_local_nftables"]),
    api(&["Service spec.healthCheckNodePort"], Class::Same, "served with kube-proxy's answers (200 with local endpoints, 503 without)")
        .tests(&["services_nftables"]),
    api(&["Service spec.trafficDistribution"], Class::Same, "read as kube-proxy reads it: through the hints the EndpointSlice controller derives from it (below)")
        .tests(&["topology_hints_and_fallbacks", "topology_hints_nftables"]),
    api(&["EndpointSlice label kubernetes.io/service-name", "EndpointSlice addressType", "EndpointSlice ports", "EndpointSlice endpoints[].addresses"], Class::Same, "merged per Service, port and family, deduplicated by address; FQDN slices ignored")
        .tests(&["endpoints_merged_across_slices_deduplicated_and_matched_by_port_name"]),
    api(&["EndpointSlice endpoints[].conditions"], Class::Same, "ready endpoints; serving terminating ones when none is ready")
        .tests(&["conditions_ready_then_serving_terminating_then_reject", "terminating_endpoints_nftables"]),
    api(&["EndpointSlice endpoints[].nodeName"], Class::Same, "which endpoints are local")
        .tests(&["external_traffic_policy_local"]),
    api(&["EndpointSlice endpoints[].hints.forZones", "EndpointSlice endpoints[].hints.forNodes", "Node label topology.kubernetes.io/zone"], Class::Same, "topology: node hints, else zone hints, when every ready endpoint has one and one is for this node or zone")
        .tests(&["topology_hints_and_fallbacks", "topology_hints_nftables"]),
    api(&["EndpointSlice annotation endpoints.kubernetes.io/last-change-trigger-time"], Class::Same, "the start of `kubeproxy_network_programming_duration_seconds`")
        .tests(&["trigger_times_of_the_changed_slices"]),
    api(&["Node status.addresses"], Class::Same, "the node's primary IPs (first InternalIP per family, else ExternalIP)")
        .tests(&["nodeport_addresses", "node_ips_override_the_node_objects_per_family"]),
    api(&["Node metadata.deletionTimestamp", "Node spec.taints ToBeDeletedByClusterAutoscaler"], Class::Same, "/healthz answers 503 (load balancers drain the node)")
        .tests(&["nftables_agent_follows_manifests_survives_bad_input_and_restarts"]),
    api(&["Node spec.podCIDRs"], Class::Refused, "kube-proxy reads it only for --detect-local-mode NodeCIDR, which weir refuses"),
    api(&["ServiceCIDR (networking.k8s.io/v1)"], Class::Refused, "not watched: traffic to an unallocated address of a service CIDR is not dropped (kube-proxy's nftables mode drops it); it follows the node's routes"),
    // Metrics (weir's own, `weir_*`, are in the sections above).
    metric(&["kubeproxy_sync_proxy_rules_endpoint_changes_pending", "kubeproxy_sync_proxy_rules_endpoint_changes_total", "kubeproxy_sync_proxy_rules_service_changes_pending", "kubeproxy_sync_proxy_rules_service_changes_total", "kubeproxy_proxy_healthz_total", "kubeproxy_proxy_livez_total"], Class::Same, "the same names, labels and meaning")
        .tests(&["names_and_values_follow_kube_proxy"]),
    metric(&["kubeproxy_sync_proxy_rules_duration_seconds", "kubeproxy_sync_proxy_rules_last_timestamp_seconds", "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", "kubeproxy_sync_proxy_rules_nftables_sync_failures_total", "kubeproxy_conntrack_reconciler_deleted_entries_total"], Class::Differs, "no `ip_family` label (one weir sync programs both families); the deleted entries are the UDP ones each sync removes")
        .tests(&["names_and_values_follow_kube_proxy"]),
    metric(&["kubeproxy_sync_full_proxy_rules_duration_seconds", "kubeproxy_sync_partial_proxy_rules_duration_seconds"], Class::Differs, "no `ip_family` label; in every mode (kube-proxy: iptables and nftables); a sync that changed nothing counts as partial")
        .tests(&["names_and_values_follow_kube_proxy"]),
    metric(&["kubeproxy_sync_proxy_rules_iptables_restore_failures_total"], Class::Differs, "no `ip_family` label; iptables mode only (kube-proxy has it in ipvs mode too, where weir counts `weir_proxy_sync_failures_total`)")
        .tests(&["names_and_values_follow_kube_proxy"]),
    metric(&["kubeproxy_network_programming_duration_seconds"], Class::Differs, "no `ip_family` label; for a slice without the trigger-time annotation, from when weir saw the change")
        .tests(&["names_and_values_follow_kube_proxy"]),
    metric(&["kubeproxy_sync_proxy_rules_no_local_endpoints_total"], Class::Differs, "no `ip_family` label; `traffic_policy` as kube-proxy")
        .tests(&["no_local_endpoints_counts_local_policy_ports_with_remote_endpoints_only"]),
    metric(&["kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"], Class::Refused, "not exported: weir counts every failed restore or sync, full or partial, cleanup included, in the mode's failure counter and `weir_proxy_sync_failures_total`"),
    metric(&["kubeproxy_sync_proxy_rules_iptables_total", "kubeproxy_sync_proxy_rules_iptables_last"], Class::Refused, "not exported: weir does not count its rules per table"),
    metric(&["kubeproxy_conntrack_reconciler_sync_duration_seconds"], Class::Refused, "not exported: weir removes stale UDP entries inside each sync, timed with it"),
    metric(&["kubeproxy_iptables_ct_state_invalid_dropped_packets_total", "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"], Class::Refused, "not exported: weir's rules have no nfacct counters"),
    metric(&["kubeproxy_nftables_localhost_nodeport_listeners", "kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total", "kubeproxy_nftables_localhost_nodeport_rejected_packets_total"], Class::Refused, "not exported: weir's nftables mode has no localhost NodePorts (the gate is refused)"),
    metric(&["kubeproxy_sync_proxy_rules_winkernel_lb_create_failures_total", "kubeproxy_sync_proxy_rules_winkernel_lb_update_failures_total", "kubeproxy_sync_proxy_rules_winkernel_lb_delete_failures_total"], Class::Refused, "not exported: Windows (kernelspace mode) only"),
];

/// Configuration fields weir reads that are not kube-proxy 1.37's (a later draft's): applied,
/// with a notice saying so.
pub const WEIR_FIELDS: &[&str] = &["syncPeriod", "minSyncPeriod"];

/// The configuration's objects (whose fields are rows) and maps.
const SECTIONS: &[&str] = &[
    "clientConnection",
    "logging",
    "logging.options",
    "logging.options.text",
    "logging.options.json",
    "iptables",
    "ipvs",
    "nftables",
    "winkernel",
    "detectLocal",
    "conntrack",
];

/// The row holding `name` (a flag with its dashes, a field path, a gate's name) of `kind`.
pub fn find(kind: Kind, name: &str) -> Option<&'static Row> {
    find_in(ROWS, kind, name)
}

/// kube-proxy's list, for [`OnlyFlags`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeProxy;

impl Table for KubeProxy {
    fn rows() -> &'static [Row] {
        ROWS
    }
}

/// kube-proxy's flags that weir has no flag of its own for, as given: noticed or refused by
/// name (hidden from `--help`).
pub type KubeProxyOnlyFlags = OnlyFlags<KubeProxy>;

/// `--feature-gates` as pflag's map flag reads it: `Name=bool,Name=bool`.
pub fn parse_gates(s: &str) -> Result<Vec<(String, bool)>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("{p:?}: expected Name=true or Name=false"))?;
            Ok((k.trim().to_string(), parse_go_bool(v.trim())?))
        })
        .collect()
}

/// Checks the feature gates (name → value, as given; `shown` prefixes what a message names:
/// `--feature-gates` or the file's `featureGates`).
pub fn check_gates(gates: &BTreeMap<String, (bool, String)>, out: &mut Findings) {
    for (name, (value, shown)) in gates {
        match find(Kind::Gate, name) {
            Some(row) => out.add(row.judge(&format!("{shown} {name}"), &value.to_string())),
            None => out.notices.push(format!(
                "{shown} {name}={value}: accepted; not a gate weir knows of, no effect \
                 (kube-proxy 1.37 refuses names it does not know)"
            )),
        }
    }
}

/// A YAML scalar as the rows' `harmless` values spell it (`None`: null, i.e. unset).
fn scalar(v: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match v {
        Value::Null => None,
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        Value::Array(a) if a.is_empty() => Some(String::new()),
        Value::Array(a) => Some(
            a.iter()
                .map(|x| scalar(x).unwrap_or_default())
                .collect::<Vec<_>>()
                .join(","),
        ),
        Value::Object(o) if o.is_empty() => Some(String::new()),
        Value::Object(_) => Some("{…}".into()),
    }
}

/// Walks a KubeProxyConfiguration (as decoded YAML) against [`ROWS`]: a notice or refusal per
/// field weir does not apply, a notice per field that is not kube-proxy 1.37's, at any depth
/// (`path` names it). Returns the file's `featureGates`.
pub fn check_config(doc: &serde_json::Value, out: &mut Findings) -> BTreeMap<String, bool> {
    let mut gates = BTreeMap::new();
    if let Some(map) = doc.as_object() {
        walk("", map, out, &mut gates);
    }
    gates
}

fn walk(
    prefix: &str,
    map: &serde_json::Map<String, serde_json::Value>,
    out: &mut Findings,
    gates: &mut BTreeMap<String, bool>,
) {
    for (k, v) in map {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if path == "featureGates" {
            for (g, b) in v.as_object().into_iter().flatten() {
                match b.as_bool() {
                    Some(b) => {
                        gates.insert(g.clone(), b);
                    }
                    None if b.is_null() => {}
                    None => out
                        .refused
                        .push(format!("featureGates.{g}: {b} is not true or false")),
                }
            }
            continue;
        }
        if SECTIONS.contains(&path.as_str()) {
            match v.as_object() {
                Some(m) => walk(&path, m, out, gates),
                None if v.is_null() => {}
                // The typed decoding names the type error.
                None => {}
            }
            continue;
        }
        let Some(value) = scalar(v) else { continue };
        if prefix.is_empty() && WEIR_FIELDS.contains(&k.as_str()) {
            out.notices.push(format!(
                "{path}: not a kubeproxy.config.k8s.io/v1alpha1 field (kube-proxy 1.37 ignores \
                 it); weir applies it over the mode's section"
            ));
            continue;
        }
        match find(Kind::Option, &path) {
            Some(row) => out.add(row.judge(&path, &value)),
            // kube-proxy 1.37 logs its strict decoding's error and runs on without the field;
            // a typo (`clusterCidr`) would then leave the real field unset: an error here.
            None => out.unknown.push(path),
        }
    }
}

/// The field names a KubeProxyConfiguration (weir's reading of it) has directly under
/// `prefix` ("" for the top level).
pub fn known_fields(prefix: &str) -> Vec<&'static str> {
    let under = |path: &'static str| -> Option<&'static str> {
        let rest = match prefix {
            "" => path,
            p => path.strip_prefix(p)?.strip_prefix('.')?,
        };
        (!rest.contains('.')).then_some(rest)
    };
    let fields = ROWS
        .iter()
        .filter(|r| r.kind == Kind::Option)
        .flat_map(|r| r.names.iter().copied())
        .filter(|n| !n.starts_with('-'));
    let top = (prefix.is_empty()).then_some(WEIR_FIELDS.iter().copied());
    let mut out: Vec<&str> = fields
        .chain(SECTIONS.iter().copied())
        .chain(top.into_iter().flatten())
        .filter_map(under)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The known field `name` was most likely meant as: the same name in another case, else the
/// closest within two edits.
pub fn did_you_mean(name: &str, known: &[&'static str]) -> Option<&'static str> {
    if let Some(k) = known.iter().find(|k| k.eq_ignore_ascii_case(name)) {
        return Some(k);
    }
    known
        .iter()
        .map(|k| (edits(&name.to_lowercase(), &k.to_lowercase()), *k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::foreign_flags::arg_id;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<crate::Cli, clap::Error> {
        let mut argv = vec!["weir".to_string(), "proxy".to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        crate::Cli::try_parse_from(super::super::kube_proxy_spelling(
            argv.into_iter().map(Into::into).collect(),
        ))
    }

    /// A valid value for each of kube-proxy's flags.
    fn sample(flag: &str) -> &'static str {
        match flag {
            "--proxy-mode" => "iptables",
            "--logging-format" => "json",
            "--feature-gates" => "NFTablesNetlink=true",
            "--bind-address" => "10.0.0.1",
            "--healthz-bind-address" | "--metrics-bind-address" => "127.0.0.1:10999",
            "--cluster-cidr" | "--ipvs-exclude-cidrs" => "10.244.0.0/16",
            "--nodeport-addresses" => "primary",
            "--version" => "raw",
            "--oom-score-adj" => "-999",
            "--detect-local-mode" => "ClusterCIDR",
            f if f.contains("period") || f.contains("timeout") || f.contains("frequency") => "30s",
            _ => "1",
        }
    }

    fn proxy(cli: crate::Cli) -> super::super::ProxyArgs {
        match cli.command {
            crate::Command::Proxy(a) => *a,
            #[allow(unreachable_patterns)]
            _ => panic!("not proxy"),
        }
    }

    #[test]
    fn every_kube_proxy_flag_parses_through_the_real_command() {
        let mut seen = 0;
        for row in ROWS {
            for flag in row.flags() {
                seen += 1;
                let forms: Vec<String> = match (flag, row.boolean) {
                    ("-h" | "--help", _) => vec![flag.to_string()],
                    (_, true) => vec![flag.to_string(), format!("{flag}=false")],
                    ("-v", _) => vec!["-v".into(), "-v=2".into(), "-v2".into()],
                    _ => vec![format!("{flag}={}", sample(flag))],
                };
                for form in forms {
                    let mut args: Vec<&str> = form.split(' ').collect();
                    if form == "-v" {
                        args.push("2");
                    }
                    match parse(&args) {
                        Ok(_) => {}
                        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {}
                        Err(e) => panic!("{form}: {e}"),
                    }
                }
                // pflag's spelling with underscores (kube-proxy normalises them).
                if flag.len() > 2 && flag[2..].contains('-') {
                    let value = if row.boolean { "false" } else { sample(flag) };
                    let under = format!("--{}={value}", flag[2..].replace('-', "_"));
                    if let Err(e) = parse(&[&under]) {
                        panic!("{under}: {e}");
                    }
                }
            }
        }
        // kube-proxy 1.37's flags: options.go's, component-base's logging flags (json's too:
        // kube-proxy registers that format), cobra's help and verflag's version.
        let kube_proxy: std::collections::BTreeSet<&str> = [
            "bind-address",
            "bind-address-hard-fail",
            "cleanup",
            "cluster-cidr",
            "config",
            "config-sync-period",
            "conntrack-max-per-core",
            "conntrack-min",
            "conntrack-tcp-be-liberal",
            "conntrack-tcp-timeout-close-wait",
            "conntrack-tcp-timeout-established",
            "conntrack-udp-timeout",
            "conntrack-udp-timeout-stream",
            "detect-local-mode",
            "feature-gates",
            "healthz-bind-address",
            "healthz-port",
            "hostname-override",
            "init-only",
            "iptables-localhost-nodeports",
            "iptables-masquerade-bit",
            "iptables-min-sync-period",
            "iptables-sync-period",
            "ipvs-exclude-cidrs",
            "ipvs-min-sync-period",
            "ipvs-scheduler",
            "ipvs-strict-arp",
            "ipvs-sync-period",
            "ipvs-tcp-timeout",
            "ipvs-tcpfin-timeout",
            "ipvs-udp-timeout",
            "kube-api-burst",
            "kube-api-content-type",
            "kube-api-qps",
            "kubeconfig",
            "masquerade-all",
            "master",
            "metrics-bind-address",
            "metrics-port",
            "nodeport-addresses",
            "oom-score-adj",
            "pod-bridge-interface",
            "pod-interface-name-prefix",
            "profiling",
            "proxy-mode",
            "show-hidden-metrics-for-version",
            "write-config-to",
            "logging-format",
            "log-flush-frequency",
            "v",
            "vmodule",
            "log-text-split-stream",
            "log-text-info-buffer-size",
            "log-json-split-stream",
            "log-json-info-buffer-size",
            "version",
            "help",
        ]
        .into_iter()
        .collect();
        let in_rows: std::collections::BTreeSet<&str> = ROWS
            .iter()
            .flat_map(|r| r.flags())
            .filter(|f| f.starts_with("--"))
            .map(|f| &f[2..])
            .collect();
        assert_eq!(in_rows, kube_proxy);
        let shorts: Vec<&str> = ROWS
            .iter()
            .flat_map(|r| r.flags())
            .filter(|f| !f.starts_with("--"))
            .collect();
        assert_eq!(shorts, ["-h", "-v"]);
        assert_eq!(seen, kube_proxy.len() + 2);
        // A value flag also takes its value as the next argument, hyphens and all.
        assert!(parse(&["--kube-api-qps", "20"]).is_ok());
        assert!(parse(&["--oom-score-adj", "-999"]).is_ok());
        // Not kube-proxy's: still clap's usage error.
        let e = parse(&["--no-such-flag"]).err().unwrap();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
    }

    #[test]
    fn the_flags_weir_lacks_come_from_the_list_and_the_rest_are_typed() {
        use clap::CommandFactory;
        let cli = crate::Cli::command();
        let proxy = cli.find_subcommand("proxy").unwrap();
        for row in ROWS {
            for flag in row.flags().filter(|f| !matches!(*f, "-h" | "--help")) {
                let arg = proxy
                    .get_arguments()
                    .find(|a| {
                        a.get_long() == Some(arg_id(flag))
                            || (flag.len() == 2 && a.get_short() == flag.chars().nth(1))
                    })
                    .unwrap_or_else(|| panic!("{flag} is not an argument"));
                // A flag weir applies has help text; the ones only noticed or refused are
                // hidden (docs/proxy.md lists them).
                assert_eq!(arg.is_hide_set(), !row.applied, "{flag}");
            }
        }
    }

    /// Every field of k8s.io/kube-proxy@v0.37.2's config/v1alpha1 KubeProxyConfiguration
    /// (with component-base's ClientConnectionConfiguration and LoggingConfiguration) has a
    /// row, and every row's field is one of them.
    #[test]
    fn every_v1alpha1_field_has_a_row() {
        let v1alpha1: std::collections::BTreeSet<&str> = [
            "apiVersion",
            "kind",
            "featureGates",
            "clientConnection.kubeconfig",
            "clientConnection.acceptContentTypes",
            "clientConnection.contentType",
            "clientConnection.qps",
            "clientConnection.burst",
            "logging.format",
            "logging.flushFrequency",
            "logging.verbosity",
            "logging.vmodule",
            "logging.options.text.splitStream",
            "logging.options.text.infoBufferSize",
            "logging.options.json.splitStream",
            "logging.options.json.infoBufferSize",
            "hostnameOverride",
            "bindAddress",
            "healthzBindAddress",
            "metricsBindAddress",
            "bindAddressHardFail",
            "enableProfiling",
            "showHiddenMetricsForVersion",
            "mode",
            "iptables.masqueradeBit",
            "iptables.masqueradeAll",
            "iptables.localhostNodePorts",
            "iptables.syncPeriod",
            "iptables.minSyncPeriod",
            "ipvs.syncPeriod",
            "ipvs.minSyncPeriod",
            "ipvs.scheduler",
            "ipvs.excludeCIDRs",
            "ipvs.strictARP",
            "ipvs.tcpTimeout",
            "ipvs.tcpFinTimeout",
            "ipvs.udpTimeout",
            "nftables.masqueradeBit",
            "nftables.masqueradeAll",
            "nftables.syncPeriod",
            "nftables.minSyncPeriod",
            "winkernel.networkName",
            "winkernel.sourceVip",
            "winkernel.enableDSR",
            "winkernel.rootHnsEndpointName",
            "winkernel.forwardHealthCheckVip",
            "detectLocalMode",
            "detectLocal.bridgeInterface",
            "detectLocal.interfaceNamePrefix",
            "clusterCIDR",
            "nodePortAddresses",
            "oomScoreAdj",
            "conntrack.maxPerCore",
            "conntrack.min",
            "conntrack.tcpEstablishedTimeout",
            "conntrack.tcpCloseWaitTimeout",
            "conntrack.tcpBeLiberal",
            "conntrack.udpTimeout",
            "conntrack.udpStreamTimeout",
            "configSyncPeriod",
            "portRange",
            "windowsRunAsService",
        ]
        .into_iter()
        .collect();
        let in_rows: std::collections::BTreeSet<&str> = ROWS
            .iter()
            .filter(|r| r.kind == Kind::Option)
            .flat_map(|r| r.names.iter().copied())
            .filter(|n| !n.starts_with('-'))
            .collect();
        assert_eq!(in_rows, v1alpha1);
        // Each section the walk descends into holds fields of the list.
        for s in SECTIONS {
            assert!(
                v1alpha1.iter().any(|f| f.starts_with(&format!("{s}."))),
                "{s}"
            );
        }
    }

    #[test]
    fn rows_are_well_formed() {
        crate::foreign_flags::doc_table::well_formed(ROWS);
    }

    #[test]
    fn each_class_does_what_it_says() {
        let mut f = Findings::default();
        let flags = KubeProxyOnlyFlags::new(vec![
            ("--kube-api-qps", "20".into()),
            ("--profiling", "false".into()),
            ("--profiling", "t".into()),
            ("--detect-local-mode", "ClusterCIDR".into()),
            ("--detect-local-mode", "NodeCIDR".into()),
            ("--init-only", "true".into()),
        ]);
        flags.check(&mut f);
        assert_eq!(f.notices.len(), 2, "{:?}", f.notices);
        assert!(f.notices[0].starts_with("--kube-api-qps=20: accepted; no effect"));
        assert!(f.notices[1].starts_with("--profiling=true: accepted; no effect"));
        assert_eq!(f.refused.len(), 2, "{:?}", f.refused);
        assert!(f.refused[0].starts_with("--detect-local-mode=NodeCIDR: refused: weir tells"));
        assert!(f.refused[1].contains("--init-only=true: refused"));
    }

    #[test]
    fn kube_proxys_no_op_fields_pass_silently_and_unknown_ones_are_named() {
        let yaml = serde_json::json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "portRange": "",
            "windowsRunAsService": false,
            "winkernel": {"networkName": "", "enableDSR": false},
            "clientConnection": {"kubeconfig": "/k", "qps": 5, "acceptContentTypes": ""},
            "conntrack": {"maxPerCore": null, "min": 0},
            "logging": {"flushFrequency": 0, "verbosity": 2,
                        "options": {"text": {"infoBufferSize": "0"}, "json": {"splitStream": true}}},
            "detectLocalMode": "NodeCIDR",
            "iptables": {"masqueradeBit": 14, "localhostNodePorts": true, "sourceRange": 1},
            "featureGates": {"NFTablesNetlink": true},
            "bogus": {"deep": 1},
            "syncPeriod": "10s",
        });
        let mut f = Findings::default();
        let gates = check_config(&yaml, &mut f);
        assert_eq!(
            gates,
            BTreeMap::from([("NFTablesNetlink".to_string(), true)])
        );
        let n = f.notices.join("\n");
        for expected in [
            "clientConnection.qps=5: accepted; no effect",
            "logging.options.json.splitStream=true: accepted; no effect",
            "iptables.localhostNodePorts=true: accepted;",
            "syncPeriod: not a kubeproxy.config.k8s.io/v1alpha1 field",
        ] {
            assert!(n.contains(expected), "{expected}:\n{n}");
        }
        assert_eq!(f.notices.len(), 4, "{n}");
        assert_eq!(f.unknown, ["bogus", "iptables.sourceRange"]);
        assert_eq!(
            f.refused,
            [
                "detectLocalMode=NodeCIDR: refused: weir tells pod traffic by --cluster-cidr only \
              (`ClusterCIDR`, the default); `NodeCIDR`, `BridgeInterface` and \
              `InterfaceNamePrefix` are not implemented"
            ]
        );
    }

    #[test]
    fn feature_gates_weir_has_pass_and_the_others_are_named() {
        assert_eq!(
            parse_gates("A=true, B=f,").unwrap(),
            [("A".to_string(), true), ("B".to_string(), false)]
        );
        assert!(parse_gates("A").is_err() && parse_gates("A=maybe").is_err());
        let gates = |list: &[(&str, bool)]| -> Findings {
            let m = list
                .iter()
                .map(|(k, v)| (k.to_string(), (*v, "--feature-gates".to_string())))
                .collect();
            let mut f = Findings::default();
            check_gates(&m, &mut f);
            f
        };
        // weir's behaviour: nothing to say.
        let f = gates(&[
            ("AllowServiceExternalIPs", true),
            ("PreferSameTrafficDistribution", true),
            ("NFTablesNetlink", true),
            ("KubeProxyNFTablesLocalhostNodePorts", false),
            ("KubeProxyIPVS", false),
            ("WinDSR", true),
        ]);
        assert!(f.notices.is_empty() && f.refused.is_empty(), "{f:?}");
        let f = gates(&[
            ("AllowServiceExternalIPs", false),
            ("KubeProxyNFTablesLocalhostNodePorts", true),
            ("NFTablesNetlink", false),
            ("SomethingElse", true),
        ]);
        assert_eq!(f.refused.len(), 2, "{f:?}");
        assert!(f.refused[0].starts_with("--feature-gates AllowServiceExternalIPs=false: refused"));
        assert!(f.refused[1]
            .starts_with("--feature-gates KubeProxyNFTablesLocalhostNodePorts=true: refused"));
        assert_eq!(f.notices.len(), 2, "{f:?}");
        assert!(f.notices[1].contains("SomethingElse=true: accepted; not a gate weir knows"));
    }

    /// docs/proxy.md's section "kube-proxy 1.37 beside weir proxy" holds exactly these rows
    /// (on failure the expected table is printed, to paste), and every test a row names exists.
    #[test]
    fn the_docs_table_is_this_list() {
        crate::foreign_flags::doc_table::check(
            "proxy.md",
            "kube-proxy 1.37 beside weir proxy",
            "| kind | kube-proxy 1.37 | weir | what weir does |",
            ROWS,
        );
    }

    #[test]
    fn kube_proxy_only_flags_keep_their_order_and_values() {
        let a =
            proxy(parse(&["--profiling", "--kube-api-qps", "20", "--profiling=false"]).unwrap());
        assert_eq!(
            a.flags.kube_proxy.given,
            [
                ("--profiling", "true".to_string()),
                ("--kube-api-qps", "20".to_string()),
                ("--profiling", "false".to_string()),
            ]
        );
    }
}
