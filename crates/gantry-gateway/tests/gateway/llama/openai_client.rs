//! The official `openai` Python client against the gateway and a real backend: chat,
//! streams with and without usage, the model list, and a 404 it understands.
//!
//! Needs `GANTRY_PYTHON` (scripts/python-env.sh prints it; scripts/test.sh sets it).

use crate::common::TestGateway;

const OPENAI_CLIENT_CHECK: &str = r#"
import sys
import openai

base_url, api_key, model = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
messages = [{"role": "user", "content": "hello"}]

reply = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
assert reply.choices[0].message.role == "assistant", reply
assert reply.usage.total_tokens > 0, reply

chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4, stream=True))
assert chunks, "no chunks"
assert all(chunk.choices for chunk in chunks), "a usage-only chunk reached the client"

chunks = list(client.chat.completions.create(
    model=model, messages=messages, max_tokens=4, stream=True,
    stream_options={"include_usage": True}))
assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0, chunks[-1]

assert model in [m.id for m in client.models.list().data]

try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    raise AssertionError("expected a 404")
except openai.NotFoundError as e:
    assert e.code == "model_not_found", e.body
print("openai client ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_python_client_works_against_the_gateway() {
    let Some(python) = std::env::var_os("GANTRY_PYTHON") else {
        panic!(
            "GANTRY_PYTHON is not set. This test runs the official openai Python client: run \
             the tests with scripts/test.sh, or set GANTRY_PYTHON=$(scripts/python-env.sh | tail -1)."
        );
    };
    let gateway = TestGateway::start().await;
    let backend = gateway.llama_server().await;
    gateway.deploy("tiny", &[backend.address()]).await;
    let output = tokio::process::Command::new(&python)
        .arg("-c")
        .arg(OPENAI_CLIENT_CHECK)
        .arg(format!("{}/v1", gateway.base))
        .arg(&gateway.key)
        .arg("tiny")
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {python:?}: {e}"));
    assert!(
        output.status.success(),
        "the openai client failed ({}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    drop(backend);
    gateway.shutdown().await;
}
