//! `weir-cni --version` for operators; the CNI VERSION command is untouched by it.

use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn version_flag_prints_the_plugin_version_and_cni_version_still_answers_json() {
    let out = Command::new(env!("CARGO_BIN_EXE_weir-cni"))
        .arg("--version")
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(&format!(
            "CNI plugin weir-cni version {}\n",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    assert!(
        text.contains("CNI protocol versions supported: 0.3.0"),
        "{text}"
    );

    let mut child = Command::new(env!("CARGO_BIN_EXE_weir-cni"))
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"cniVersion":"1.0.0"}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cniVersion"], "1.0.0");
    assert!(v["supportedVersions"].as_array().unwrap().len() >= 5, "{v}");
}
