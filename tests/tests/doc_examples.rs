//! Docs work as written: every YAML example in `README.md`, `deploy/README.md` and
//! `docs/*.md` is taken exactly as written and parsed by the parser it is for. A fenced
//! block says what it is after its language: ```` ```yaml vgpu-config ```` (the quota
//! config: `vgpu_contract::Config`), `plugin-config` (the device plugin's), `dra-config`
//! (the DRA driver's), `kubernetes` (manifests: YAML documents with `apiVersion` and
//! `kind`), `prometheus-rules` (rule groups naming only metrics), or `not-config`. A
//! YAML block that says nothing, or says something else, fails the test, so no example
//! can slip past it.

use std::path::{Path, PathBuf};

use vgpu_test_support::repo_root;

/// One fenced block: where it starts, its info string, its text.
#[derive(Debug)]
struct Block {
    file: PathBuf,
    line: usize,
    info: String,
    text: String,
}

/// Every fenced block of a Markdown text (```` ``` ```` fences, any indentation of the
/// fence kept out of the text).
fn blocks(file: &Path, markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String, String)> = None;
    for (number, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => {
                let info = line.trim_start().trim_start_matches('`').trim().to_string();
                open = Some((number + 1, info, String::new()));
            }
            (Some((start, info, text)), true) => {
                out.push(Block {
                    file: file.to_path_buf(),
                    line: *start,
                    info: std::mem::take(info),
                    text: std::mem::take(text),
                });
                open = None;
            }
            (Some((_, _, text)), false) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, false) => {}
        }
    }
    assert!(
        open.is_none(),
        "{}: a fence is never closed",
        file.display()
    );
    out
}

/// The Markdown files whose examples are checked.
fn documents() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![root.join("README.md"), root.join("deploy/README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// What a YAML block is, from the word after its language.
fn kind(block: &Block) -> Option<&str> {
    let mut words = block.info.split_whitespace();
    let language = words.next()?;
    (language == "yaml" || language == "yml").then(|| words.next().unwrap_or(""))
}

/// Parses one block with its parser; the error says why it was rejected.
fn check(block: &Block, kind: &str) -> Result<(), String> {
    let origin = Path::new("example");
    match kind {
        "vgpu-config" => vgpu_contract::Config::from_yaml(&block.text, origin)
            .map(drop)
            .map_err(|err| err.to_string()),
        "plugin-config" => vgpu_node_agent::config::NodeConfig::from_yaml(&block.text, origin)
            .map(drop)
            .map_err(|err| format!("{err:#}")),
        "dra-config" => vgpu_dra::config::DraConfig::from_yaml(&block.text, origin)
            .map(drop)
            .map_err(|err| format!("{err:#}")),
        "kubernetes" => {
            let mut documents = 0;
            let values: Vec<serde_json::Value> = serde_saphyr::from_multiple(&block.text)
                .map_err(|err| format!("not YAML: {err}"))?;
            for value in values {
                if value.is_null() {
                    continue;
                }
                for field in ["apiVersion", "kind"] {
                    if !value.get(field).is_some_and(serde_json::Value::is_string) {
                        return Err(format!("a document without `{field}`"));
                    }
                }
                documents += 1;
            }
            if documents == 0 {
                return Err("no Kubernetes object".into());
            }
            Ok(())
        }
        "prometheus-rules" => {
            let value: serde_json::Value =
                serde_saphyr::from_str(&block.text).map_err(|err| format!("not YAML: {err}"))?;
            let groups = value["groups"].as_array().ok_or("no `groups` list")?;
            for rule in groups.iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()) {
                if rule["expr"].as_str().is_none_or(str::is_empty) {
                    return Err(format!("a rule without `expr`: {rule}"));
                }
            }
            Ok(())
        }
        "not-config" => serde_saphyr::from_str::<serde_json::Value>(&block.text)
            .map(drop)
            .map_err(|err| format!("not YAML: {err}")),
        "" => Err("a YAML block that says nothing of what it is (```yaml vgpu-config, plugin-config, dra-config, kubernetes, prometheus-rules or not-config)".into()),
        other => Err(format!("unknown kind `{other}`")),
    }
}

#[test]
fn every_yaml_example_in_the_docs_parses_with_its_real_parser() {
    let mut checked = std::collections::BTreeMap::<String, usize>::new();
    let mut rejected = Vec::new();
    for file in documents() {
        let markdown = std::fs::read_to_string(&file).expect("read");
        for block in blocks(&file, &markdown) {
            let Some(kind) = kind(&block) else { continue };
            match check(&block, kind) {
                Ok(()) => *checked.entry(kind.to_string()).or_default() += 1,
                Err(why) => rejected.push(format!(
                    "{}:{}: ```{}: {why}",
                    block.file.display(),
                    block.line,
                    block.info
                )),
            }
        }
    }
    assert!(rejected.is_empty(), "rejected:\n{}", rejected.join("\n"));
    // The README's quota config and its hard variant, the plugin's and the DRA
    // driver's configs of docs/ at least.
    for (kind, least) in [("vgpu-config", 3), ("plugin-config", 1)] {
        assert!(
            checked.get(kind).copied().unwrap_or(0) >= least,
            "fewer than {least} {kind} examples found: {checked:?}"
        );
    }
    eprintln!("checked: {checked:?}");
}

#[test]
fn the_checker_rejects_what_the_old_readme_had() {
    // The README's example before issue 27: `container_id` twice, and a ceiling with a
    // hard mode. Both must be refused, or the test above proves nothing.
    let twice = "container_id: a\ncontainer_id: b\ndevices: []\n";
    let block = |text: &str| Block {
        file: PathBuf::from("t.md"),
        line: 1,
        info: "yaml vgpu-config".into(),
        text: text.into(),
    };
    let error = check(&block(twice), "vgpu-config").expect_err("duplicate key");
    assert!(
        error.contains("duplicate") && error.contains("container_id"),
        "{error}"
    );
    let hard_ceiling =
        "devices:\n  - index: 0\n    core_limit: 30\n    core_mode: hard\n    core_ceiling: 50\n";
    let error = check(&block(hard_ceiling), "vgpu-config").expect_err("ceiling");
    assert!(
        error.contains("only meaningful with core_mode: soft"),
        "{error}"
    );
    assert!(
        check(&block("a: 1\n"), "").is_err(),
        "an untagged block fails"
    );
    let markdown = "x\n```yaml plugin-config\npolicy: spread\n```\n```sh\nls\n```\n";
    let found = blocks(Path::new("t.md"), markdown);
    assert_eq!(found.len(), 2);
    assert_eq!(kind(&found[0]), Some("plugin-config"));
    assert_eq!(found[0].text, "policy: spread\n");
    assert_eq!(kind(&found[1]), None);
}
