//! Models from Hugging Face, end to end with real processes: `gantry server` and
//! `gantry worker` pointed (`--hf-endpoint`) at a hub double in this test process
//! (`gantry_testkit::hub`, a TEST DOUBLE of the hub's HTTP protocol, checked against the
//! official `huggingface_hub` client in its own test), a real `llama-server`.
//!
//! * A model named by a glob is estimated from its header, placed, downloaded by the
//!   chosen worker only, shown `downloading` with progress, started and served through
//!   the gateway. The worker is `kill -9`ed mid-download (the double is throttled); the
//!   restarted worker resumes from the bytes on disk: less than 1.2× the file is served
//!   to the worker in all.
//! * Wrong bytes (the double corrupts the file once the worker downloads it): the
//!   instance ends in `error` naming both digests, and nothing is left in the worker's
//!   cache.
//! * A split GGUF (three parts named and laid out as llama.cpp's `gguf-split` writes them,
//!   built here from the tiny model): naming the first part brings every part; the worker
//!   downloads all three (and not the repository's other GGUF), starts `llama-server` on the
//!   first part, which loads the others from beside it, and the model answers through the
//!   gateway.
//! * A vLLM-style safetensors repository (`config.json`, tokenizer, an index and two shards
//!   of a few megabytes, plus a README, a `pytorch_model.bin` and an `optimizer.pt`):
//!   estimated from `config.json`, the index and the shards' headers before any worker
//!   exists (a few kilobytes of the shards' megabytes are served), placed on a simulated
//!   24 GiB GPU with the weights' exact size in its claim, then downloaded by the worker:
//!   exactly the files vLLM loads, handed to a stand-in `vllm` program that records its
//!   arguments and exits (no vLLM is installed; nothing after the download is checked).

use crate::common;

use std::path::Path;
use std::time::Duration;

use crate::common::{tail, Cluster, Process};
use gantry_gguf::tiny_llama::XorShift64;
use gantry_gguf::{GgufFile, GgufWriter};
use gantry_testkit::hub::{HubDouble, HubFile, HubRepo};
use gantry_types::{InstanceState, LogQuery, ModelCreate, ModelMemory};
use serde_json::json;

const REPO: &str = "gantry-test/Tiny-GGUF";
const FILE: &str = "tiny-Q4_K_M.gguf";

/// The tiny GGUF model's bytes.
fn tiny_bytes(dir: &std::path::Path) -> Vec<u8> {
    std::fs::read(common::tiny_model(dir)).unwrap()
}

/// A repository with the tiny model, another GGUF (so the glob has to choose) and a
/// README.
fn repo(bytes: &[u8]) -> HubRepo {
    HubRepo::new(
        REPO,
        vec![
            HubFile::regular("README.md", "# tiny\n"),
            HubFile::lfs(FILE, bytes.to_vec()),
            HubFile::lfs("other-Q8_0.gguf", b"not this one".to_vec()),
        ],
    )
}

fn hf_model(name: &str) -> ModelCreate {
    let source = json!({"type": "huggingface", "repo_id": REPO, "file": "*Q4_K_M.gguf"});
    common::tiny_model_create_from(name, source, 1)
}

fn start_worker(cluster: &Cluster, hub: &HubDouble) -> Process {
    cluster.worker(
        "w1",
        &[
            "--simulate-gpus",
            "1x8GiB",
            "--heartbeat-interval",
            "300ms",
            "--hf-endpoint",
            &hub.endpoint(),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hugging_face_model_is_placed_from_its_header_downloaded_resumed_and_served() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = tiny_bytes(dir.path());
    let size = bytes.len() as u64;
    let hub = HubDouble::start(vec![repo(&bytes)]).await;
    let cluster = Cluster::start(&["--hf-endpoint", &hub.endpoint()]).await;
    let mut worker = start_worker(&cluster, &hub);
    cluster.worker_id("w1", &worker).await;
    // Slow enough to catch the download half-way: about five seconds for the file.
    hub.set_throttle(Some(size / 5));

    let model = cluster
        .client()
        .create_model(&hf_model("tiny-hf"))
        .await
        .unwrap();
    // Placed from the header alone, then downloading with progress.
    let downloading = cluster
        .wait_for_first_instance(
            model.id,
            "the instance to download a third of the file",
            Duration::from_secs(60),
            &[&worker],
            |i| {
                i.state == InstanceState::Downloading
                    && i.download.is_some_and(|d| d.bytes_done * 3 >= size)
            },
        )
        .await;
    let progress = downloading.download.unwrap();
    println!(
        "downloading: {progress:?}, message {:?}",
        downloading.state_message
    );
    assert_eq!(progress.bytes_total, Some(size));
    assert!(downloading.worker_id.is_some() && downloading.placement.is_some());
    assert!(downloading.state_message.starts_with("downloading"));
    let record = downloading.placement.as_ref().unwrap();
    assert!(record.reservation.is_some(), "placed from an estimate");

    // kill -9 mid-download, then the same worker again: the download resumes.
    let served_before_kill = hub.bytes_served(REPO, FILE);
    worker.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = worker.child.take().map(|mut c| c.wait());
    let partial: u64 = std::fs::read_dir(cluster.dir.path().join("w1/worker/model-cache/partial"))
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(
        partial > 0 && partial < size,
        "a partial file of {partial} bytes"
    );
    hub.set_throttle(None);
    let worker = start_worker(&cluster, &hub);
    let running = cluster
        .wait_for_first_instance(
            model.id,
            "the instance to run after the resumed download",
            Duration::from_secs(90),
            &[&worker],
            |i| i.state == InstanceState::Running,
        )
        .await;
    // What the worker fetched: every byte of the file once, plus what was in flight when
    // it died; the server's header read (the first bytes) is counted too.
    let served = hub.bytes_served(REPO, FILE);
    println!(
        "file of {size} bytes: {served_before_kill} served before the kill ({partial} on disk), \
         {served} in all (header read included)"
    );
    assert!(
        (served as f64) < 1.2 * size as f64 + size.min(4 << 20) as f64,
        "{served} bytes served for a {size}-byte file; worker log:\n{}",
        tail(&worker.log_text(), 30)
    );
    assert!(
        hub.requests()
            .iter()
            .any(|r| r.contains(FILE) && r.contains("bytes=")),
        "a range request resumed the download: {:?}",
        hub.requests()
    );
    assert_eq!(hub.bytes_served(REPO, "other-Q8_0.gguf"), 0);

    // Served through the gateway.
    let answer = cluster.chat_via_gateway("tiny-hf").await;
    assert!(answer["choices"].is_array(), "{answer}");
    // The cache holds the verified file under its digest.
    let blob = cluster
        .dir
        .path()
        .join("w1/worker/model-cache/blobs")
        .join(format!("sha256-{}", HubDouble::sha256(&bytes)));
    assert_eq!(std::fs::read(&blob).unwrap(), bytes);
    assert!(running.download.is_none());
    drop(worker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_bytes_end_in_error_naming_both_digests_and_leave_nothing_cached() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = tiny_bytes(dir.path());
    let hub = HubDouble::start(vec![repo(&bytes)]).await;
    let cluster = Cluster::start(&["--hf-endpoint", &hub.endpoint()]).await;

    // The header the server reads is sound (the model is analysed while no worker can
    // take it); the bytes the worker then gets are not.
    let model = cluster
        .client()
        .create_model(&hf_model("tiny-bad"))
        .await
        .unwrap();
    cluster
        .wait_for_first_instance(
            model.id,
            "the model to be analysed and wait for a worker",
            Duration::from_secs(60),
            &[],
            |i| i.state == InstanceState::Pending && i.state_message.contains("worker"),
        )
        .await;
    hub.corrupt(REPO, FILE);
    let worker = start_worker(&cluster, &hub);
    cluster.worker_id("w1", &worker).await;
    let failed = cluster
        .wait_for_first_instance(
            model.id,
            "the instance to fail on the wrong bytes",
            Duration::from_secs(90),
            &[&worker],
            |i| i.state_message.contains("SHA-256"),
        )
        .await;
    println!("{}: {}", failed.state.as_str(), failed.state_message);
    assert_eq!(failed.state, InstanceState::Error);
    let expected = HubDouble::sha256(&bytes);
    assert!(
        failed.state_message.contains(&expected),
        "{}",
        failed.state_message
    );
    let got = failed
        .state_message
        .split(|c: char| !c.is_ascii_hexdigit())
        .find(|w| w.len() == 64 && w.chars().all(|c| c.is_ascii_hexdigit()) && *w != expected);
    assert!(
        got.is_some(),
        "the received digest is named: {}",
        failed.state_message
    );
    let cache = cluster.dir.path().join("w1/worker/model-cache");
    for sub in ["blobs", "partial"] {
        let left: Vec<_> = std::fs::read_dir(cache.join(sub))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{sub} holds {left:?}");
    }
    drop(worker);
}

const SPLIT_REPO: &str = "gantry-test/Tiny-Split-GGUF";
/// How many parts the tiny model is split into.
const SPLIT_PARTS: u16 = 3;

/// The name llama.cpp's `gguf-split` gives part `index` (counted from 0) of `count`.
fn split_part_name(index: u16, count: u16) -> String {
    format!("tiny-Q4_K_M-{:05}-of-{count:05}.gguf", index + 1)
}

/// `whole`, a GGUF file, cut into `count` parts the way llama.cpp's `gguf-split
/// --split-max-tensors` cuts one: the tensors in file order, the same number in each part
/// (the last may hold fewer), every part a GGUF file of its own whose data section holds its
/// tensors; all the metadata in the first part only; and in every part the keys llama.cpp's
/// loader checks before it opens the parts beside the first, with the types `gguf-split`
/// writes: `split.no` (u16, from 0), `split.count` (u16) and `split.tensors.count` (i32, the
/// tensors of all the parts). llama.cpp refuses the first part alone ("failed to load
/// model"), so a model that runs was read from every part.
fn split_gguf(whole: &[u8], count: u16) -> Vec<Vec<u8>> {
    let file = GgufFile::parse(whole).unwrap();
    let tensors_in_all = i32::try_from(file.tensors.len()).unwrap();
    let per_part = file.tensors.len().div_ceil(usize::from(count));
    let parts: Vec<Vec<u8>> = file
        .tensors
        .chunks(per_part)
        .enumerate()
        .map(|(index, tensors)| {
            let mut part = GgufWriter::new();
            if index == 0 {
                for (key, value) in &file.metadata {
                    part.add_metadata(key.clone(), value.clone()).unwrap();
                }
            }
            part.add_metadata("split.no", u16::try_from(index).unwrap())
                .unwrap()
                .add_metadata("split.count", count)
                .unwrap()
                .add_metadata("split.tensors.count", tensors_in_all)
                .unwrap();
            for tensor in tensors {
                let start = usize::try_from(file.data_offset + tensor.offset).unwrap();
                let end = start + usize::try_from(tensor.n_bytes).unwrap();
                part.add_tensor(
                    tensor.name.clone(),
                    &tensor.dims,
                    tensor.ggml_type,
                    whole[start..end].to_vec(),
                )
                .unwrap();
            }
            part.to_bytes()
        })
        .collect();
    assert_eq!(
        parts.len(),
        usize::from(count),
        "{} tensors do not make {count} parts",
        file.tensors.len()
    );
    parts
}

/// The cache directory of worker `w1`.
fn worker_cache(cluster: &Cluster) -> std::path::PathBuf {
    cluster.dir.path().join("w1/worker/model-cache")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_gguf_from_the_hub_is_downloaded_in_all_its_parts_and_served() {
    let dir = tempfile::tempdir().unwrap();
    let whole = tiny_bytes(dir.path());
    let parts = split_gguf(&whole, SPLIT_PARTS);
    let names: Vec<String> = (0..SPLIT_PARTS)
        .map(|index| split_part_name(index, SPLIT_PARTS))
        .collect();
    let mut files = vec![
        HubFile::regular("README.md", "# tiny, in three parts\n"),
        HubFile::lfs("tiny-Q8_0.gguf", b"another quantisation".to_vec()),
    ];
    files.extend(
        names
            .iter()
            .zip(&parts)
            .map(|(name, bytes)| HubFile::lfs(name.clone(), bytes.clone())),
    );
    let hub = HubDouble::start(vec![HubRepo::new(SPLIT_REPO, files)]).await;
    let cluster = Cluster::start(&["--hf-endpoint", &hub.endpoint()]).await;
    let worker = start_worker(&cluster, &hub);
    cluster.worker_id("w1", &worker).await;

    // Naming the first part is enough: the source brings the others.
    let create: ModelCreate = serde_json::from_value(json!({
        "name": "tiny-split",
        "source": {"type": "huggingface", "repo_id": SPLIT_REPO, "file": names[0]},
        "backend": "llama.cpp",
        "replicas": 1,
        // Verbosity 4 makes llama.cpp's model loader log how many parts it read.
        "backend_args": ["-c", "256", "-t", "1", "-tb", "1", "-np", "1", "-lv", "4"],
    }))
    .unwrap();
    let model = cluster.client().create_model(&create).await.unwrap();
    let running = cluster
        .wait_for_first_instance(
            model.id,
            "the split model to run",
            Duration::from_secs(90),
            &[&worker],
            |i| i.state == InstanceState::Running,
        )
        .await;
    let reservation = running
        .placement
        .as_ref()
        .and_then(|p| p.reservation.as_ref())
        .expect("placed from an estimate");
    // The estimate counts the weights of every part: the server reads each part's header
    // (a block's bytes in the claim are its weights plus its share of the KV cache).
    let block_weights = |bytes: &[u8]| {
        GgufFile::parse(bytes)
            .unwrap()
            .tensor_bytes_by_layer()
            .blocks
    };
    println!(
        "split GGUF placed with claim {:?}; block weights {:?} in all, {:?} in the first part",
        reservation.claim.memory,
        block_weights(&whole),
        block_weights(&parts[0]),
    );
    let ModelMemory::Layers(layers) = &reservation.claim.memory else {
        panic!("a llama.cpp claim is per layer: {:?}", reservation.claim);
    };
    for (claimed, weights) in layers.block_bytes.iter().zip(block_weights(&whole)) {
        assert!(
            *claimed >= weights,
            "block claims {:?} leave out weights {:?} of the other parts",
            layers.block_bytes,
            block_weights(&whole)
        );
    }

    // Every part was downloaded whole, verified and kept under its digest (the first part
    // was also served to the server, whose first header read of 4 MiB takes all of a small
    // file); the other GGUF of the repository was not touched.
    let cache = worker_cache(&cluster);
    for (name, bytes) in names.iter().zip(&parts) {
        let served = hub.bytes_served(SPLIT_REPO, name);
        println!("{name}: {} bytes, {served} served", bytes.len());
        assert!(
            served >= bytes.len() as u64,
            "{name}: {served} of {} bytes served",
            bytes.len()
        );
        let blob = cache
            .join("blobs")
            .join(format!("sha256-{}", HubDouble::sha256(bytes)));
        assert_eq!(&std::fs::read(&blob).unwrap(), bytes, "{}", blob.display());
    }
    assert_eq!(hub.bytes_served(SPLIT_REPO, "tiny-Q8_0.gguf"), 0);

    // llama-server was given the first part and found the other two beside it.
    let port = running.port.unwrap();
    let pids = common::llama_pids_on(port);
    assert_eq!(pids.len(), 1, "one llama-server on port {port}: {pids:?}");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", pids[0])).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let model_path = args
        .windows(2)
        .find(|w| w[0] == "-m" || w[0] == "--model")
        .map(|w| w[1].clone())
        .unwrap_or_else(|| panic!("no model path in {args:?}"));
    assert!(model_path.ends_with(&names[0]), "{model_path}");
    let logs = cluster
        .client()
        .instance_logs(
            running.id,
            &LogQuery {
                tail: Some(100_000),
                ..LogQuery::default()
            },
        )
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let loaded = format!("additional {} GGUFs metadata loaded", SPLIT_PARTS - 1);
    assert!(
        logs.contains(&loaded),
        "llama-server's log does not say {loaded:?}:\n{}",
        tail(&logs, 40)
    );

    // Served through the gateway.
    let answer = cluster.chat_via_gateway("tiny-split").await;
    assert!(answer["choices"][0]["message"].is_object(), "{answer}");
    drop(worker);
}

const ENGINE_REPO: &str = "gantry-test/Tiny-Llama-HF";

/// The shape of the small llama of the safetensors repository.
const HIDDEN: u64 = 256;
const INTERMEDIATE: u64 = 688;
const LAYERS: u64 = 2;
const HEADS: u64 = 4;
const KV_HEADS: u64 = 2;
const VOCAB: u64 = 2048;

/// The repository's `config.json`.
fn engine_config() -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": false,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    })
}

/// The tensors (name, shape as PyTorch gives it) of the two shards, as `transformers`
/// names a llama's: the embedding and the first layer in the first shard, the second layer,
/// the final norm and the output projection in the second.
fn engine_shard_tensors() -> [Vec<(String, Vec<u64>)>; 2] {
    let head_dim = HIDDEN / HEADS;
    let layer = |i: u64| -> Vec<(String, Vec<u64>)> {
        let prefix = format!("model.layers.{i}");
        [
            ("input_layernorm.weight", vec![HIDDEN]),
            ("self_attn.q_proj.weight", vec![HIDDEN, HIDDEN]),
            ("self_attn.k_proj.weight", vec![KV_HEADS * head_dim, HIDDEN]),
            ("self_attn.v_proj.weight", vec![KV_HEADS * head_dim, HIDDEN]),
            ("self_attn.o_proj.weight", vec![HIDDEN, HIDDEN]),
            ("post_attention_layernorm.weight", vec![HIDDEN]),
            ("mlp.gate_proj.weight", vec![INTERMEDIATE, HIDDEN]),
            ("mlp.up_proj.weight", vec![INTERMEDIATE, HIDDEN]),
            ("mlp.down_proj.weight", vec![HIDDEN, INTERMEDIATE]),
        ]
        .into_iter()
        .map(|(name, shape)| (format!("{prefix}.{name}"), shape))
        .collect()
    };
    let mut first = vec![("model.embed_tokens.weight".to_owned(), vec![VOCAB, HIDDEN])];
    first.extend(layer(0));
    let mut second = layer(1);
    second.push(("model.norm.weight".to_owned(), vec![HIDDEN]));
    second.push(("lm_head.weight".to_owned(), vec![VOCAB, HIDDEN]));
    [first, second]
}

/// A safetensors file of BF16 tensors with seeded random bytes: the 8-byte little-endian
/// length of the JSON header, the header (padded with spaces to a multiple of 8, as the
/// `safetensors` library pads it), then the tensors' bytes back to back in the order of
/// their `data_offsets`.
fn safetensors_file(tensors: &[(String, Vec<u64>)], rng: &mut XorShift64) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".to_owned(), json!({"format": "pt"}));
    let mut data_len = 0u64;
    for (name, shape) in tensors {
        let bytes = shape.iter().product::<u64>() * 2;
        header.insert(
            name.clone(),
            json!({"dtype": "BF16", "shape": shape, "data_offsets": [data_len, data_len + bytes]}),
        );
        data_len += bytes;
    }
    let mut json = serde_json::to_vec(&header).unwrap();
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&json);
    let len = file.len() + usize::try_from(data_len).unwrap();
    while file.len() < len {
        file.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    file.truncate(len);
    file
}

/// Bytes of a safetensors file before its data: the length prefix and the JSON header.
fn safetensors_header_len(file: &[u8]) -> u64 {
    8 + u64::from_le_bytes(file[..8].try_into().unwrap())
}

/// Random bytes that stand for weights nothing should download.
fn random_bytes(len: usize, rng: &mut XorShift64) -> Vec<u8> {
    (0..len.div_ceil(8))
        .flat_map(|_| rng.next_u64().to_le_bytes())
        .take(len)
        .collect()
}

/// The files of the safetensors repository that vLLM loads, by path.
const ENGINE_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
];
/// What the repository holds besides, which vLLM does not load.
const NOT_ENGINE_FILES: &[&str] = &["README.md", "optimizer.pt", "pytorch_model.bin"];

/// A stand-in for the `vllm` program at `path`: records its arguments in `args_file` (whole,
/// by a rename) and exits 1, as a vLLM that cannot start would. The worker lists vLLM among its backends only
/// when the program exists, so the scheduler needs one to place a vLLM model.
fn write_stand_in_vllm(path: &Path, args_file: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(
        path,
        format!(
            "#!/bin/sh\necho \"$@\" > '{args}.new' && mv '{args}.new' '{args}'\n\
             echo 'a stand-in for vLLM, which this test does not have' >&2\nexit 1\n",
            args = args_file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_safetensors_model_is_placed_from_its_headers_and_only_its_vllm_files_are_downloaded() {
    let mut rng = XorShift64::new(0x5AFE_7E45_0125);
    let shard_names = &ENGINE_FILES[2..4];
    let tensors = engine_shard_tensors();
    let shards: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| safetensors_file(t, &mut rng))
        .collect();
    let weight_bytes: u64 = tensors
        .iter()
        .flatten()
        .map(|(_, shape)| shape.iter().product::<u64>() * 2)
        .sum();
    let weight_map: serde_json::Map<String, serde_json::Value> = tensors
        .iter()
        .zip(shard_names)
        .flat_map(|(tensors, shard)| {
            tensors
                .iter()
                .map(move |(name, _)| (name.clone(), json!(shard)))
        })
        .collect();
    let index = json!({"metadata": {"total_size": weight_bytes}, "weight_map": weight_map});
    let mut files = vec![
        HubFile::regular("config.json", engine_config().to_string()),
        HubFile::regular(
            "generation_config.json",
            json!({"bos_token_id": 1, "eos_token_id": 2}).to_string(),
        ),
        HubFile::regular("model.safetensors.index.json", index.to_string()),
        HubFile::regular(
            "tokenizer.json",
            json!({"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}})
                .to_string(),
        ),
        HubFile::regular("README.md", "# a small llama\n"),
        HubFile::lfs("pytorch_model.bin", random_bytes(1 << 20, &mut rng)),
        HubFile::lfs("optimizer.pt", random_bytes(256 << 10, &mut rng)),
    ];
    files.extend(
        shard_names
            .iter()
            .zip(&shards)
            .map(|(name, bytes)| HubFile::lfs(*name, bytes.clone())),
    );
    let repo = HubRepo::new(ENGINE_REPO, files.clone());
    let hub = HubDouble::start(vec![repo]).await;
    let cluster = Cluster::start(&["--hf-endpoint", &hub.endpoint()]).await;

    // Created while no worker exists: what the hub serves until the scheduler says it waits
    // for a worker is the server's reading of the headers, and nothing else.
    let create: ModelCreate = serde_json::from_value(json!({
        "name": "tiny-vllm",
        "source": {"type": "huggingface", "repo_id": ENGINE_REPO},
        "backend": "vllm",
        "replicas": 1,
    }))
    .unwrap();
    let model = cluster.client().create_model(&create).await.unwrap();
    let waiting = cluster
        .wait_for_first_instance(
            model.id,
            "the model to be analysed and wait for a worker",
            Duration::from_secs(60),
            &[],
            |i| i.state == InstanceState::Pending && i.state_message.contains("no ready worker"),
        )
        .await;
    let shards_total: u64 = shards.iter().map(|s| s.len() as u64).sum();
    let read_before_placement = hub.total_bytes_served();
    println!(
        "{read_before_placement} bytes of {shards_total} (the shards) read before placement; \
         waiting: {}",
        waiting.state_message
    );
    // Each shard exactly to the end of its header; the small JSON files whole; the rest not
    // at all.
    for (name, shard) in shard_names.iter().zip(&shards) {
        assert_eq!(
            hub.bytes_served(ENGINE_REPO, name),
            safetensors_header_len(shard),
            "{name}: only the header is read; requests: {:#?}",
            hub.requests()
        );
    }
    for name in ["config.json", "model.safetensors.index.json"] {
        let len = files.iter().find(|f| f.path == name).unwrap().bytes.len() as u64;
        assert_eq!(hub.bytes_served(ENGINE_REPO, name), len, "{name}");
    }
    assert!(
        read_before_placement > 0 && read_before_placement * 100 < shards_total,
        "{read_before_placement} bytes read to estimate {shards_total} bytes of shards"
    );

    // A worker with a 24 GiB (simulated) GPU and a program for vLLM joins: the instance is
    // placed with the estimate.
    let stand_in = cluster.dir.path().join("stand-in-vllm");
    let args_file = cluster.dir.path().join("stand-in-vllm.args");
    write_stand_in_vllm(&stand_in, &args_file);
    let worker = cluster.worker(
        "w1",
        &[
            "--simulate-gpus",
            "1x24GiB",
            "--heartbeat-interval",
            "300ms",
            "--hf-endpoint",
            &hub.endpoint(),
            "--vllm-path",
            &stand_in.display().to_string(),
        ],
    );
    let placed = cluster
        .wait_for_first_instance(
            model.id,
            "the instance to be placed",
            Duration::from_secs(90),
            &[&worker],
            |i| i.placement.is_some(),
        )
        .await;
    println!(
        "placed: {} ({})",
        placed.state.as_str(),
        placed.state_message
    );
    let reservation = placed
        .placement
        .as_ref()
        .and_then(|p| p.reservation.as_ref())
        .expect("placed from an estimate");
    let ModelMemory::Engine(engine) = &reservation.claim.memory else {
        panic!("a vLLM claim is an engine claim: {:?}", reservation.claim);
    };
    println!("claim: {engine:?}, on {:?}", reservation.placement.gpus);
    assert_eq!(
        engine.weight_bytes, weight_bytes,
        "the weights' size, summed from the shards' headers"
    );
    assert_eq!(engine.kv_head_count, u32::try_from(KV_HEADS).unwrap());
    assert_eq!(engine.minimum_kv_tokens, 2048, "max_position_embeddings");
    assert!(engine.kv_bytes_per_token_per_kv_head > 0);
    assert_eq!(reservation.placement.gpus.len(), 1);
    assert!(reservation.placement.gpus[0].bytes >= weight_bytes);

    // The worker downloads what vLLM loads and hands it the directory.
    let args = gantry_testkit::eventually(
        "the worker to start the stand-in vLLM",
        Duration::from_secs(90),
        Duration::from_millis(100),
        || async { Ok::<_, std::convert::Infallible>(std::fs::read_to_string(&args_file).ok()) },
        |args| args.is_some(),
        || format!("worker log tail:\n{}", tail(&worker.log_text(), 40)),
    )
    .await
    .unwrap();
    println!("stand-in vLLM started with: {}", args.trim());
    let words: Vec<&str> = args.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"serve"), "{args}");
    let model_dir = Path::new(words[1]);
    assert!(
        model_dir.starts_with(worker_cache(&cluster).join("snapshots")),
        "{}",
        model_dir.display()
    );
    let mut downloaded: Vec<String> = std::fs::read_dir(model_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    downloaded.sort();
    assert_eq!(downloaded, ENGINE_FILES);
    for name in ENGINE_FILES {
        let listed = &files.iter().find(|f| f.path == *name).unwrap().bytes;
        assert_eq!(
            std::fs::read(model_dir.join(name)).unwrap(),
            listed.as_ref(),
            "{name}"
        );
    }
    for name in NOT_ENGINE_FILES {
        assert_eq!(hub.bytes_served(ENGINE_REPO, name), 0, "{name} was fetched");
    }
    // Each shard once whole, after the server's header read; the headers were not read again.
    for (name, shard) in shard_names.iter().zip(&shards) {
        assert_eq!(
            hub.bytes_served(ENGINE_REPO, name),
            safetensors_header_len(shard) + shard.len() as u64,
            "{name}"
        );
    }
    println!(
        "{} bytes served in all, {read_before_placement} of them before placement",
        hub.total_bytes_served()
    );
    drop(worker);
}
