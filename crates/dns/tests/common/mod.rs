//! What the DNS memory tests share.

/// The dns bench's services (scripts/dns-bench.sh): ClusterIP, one address each.
pub fn manifests(n: usize) -> String {
    let mut yaml = String::new();
    for i in 0..n {
        yaml.push_str(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\n\
             spec: {{clusterIP: 10.{}.{}.{}}}\n---\n",
            96 + i / 62_500,
            i / 250 % 250,
            i % 250 + 1
        ));
    }
    yaml
}
