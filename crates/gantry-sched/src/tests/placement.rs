//! One test per placement rule, each on a cluster of a few workers built with
//! [`crate::testkit`].

use crate::testkit::{engine_request, fixed_request, layered_request, worker};
use crate::units::GIB;
use crate::{
    place, ClusterSnapshot, LlamaLayout, ManualGpuSelection, PlacedClaim, PlacementKind,
    PlacementRequest, SnapshotState, Strategy, Unschedulable, WorkerView,
};
use gantry_types::claim::ModelMemory;

fn cluster(workers: Vec<WorkerView>, placed: Vec<PlacedClaim>) -> ClusterSnapshot {
    ClusterSnapshot { workers, placed }
}

fn with_strategy(mut request: PlacementRequest, strategy: Strategy) -> PlacementRequest {
    request.strategy = strategy;
    request
}

fn ok(result: Result<crate::Placement, Unschedulable>) -> crate::Placement {
    match result {
        Ok(placement) => placement,
        Err(e) => panic!("expected a placement, got: {e}"),
    }
}

#[test]
fn spread_prefers_the_emptiest_worker_and_binpack_the_fullest_that_fits() {
    let snapshot = cluster(
        vec![
            worker(1, "w1").gpus(2, 80 * GIB).build(),
            worker(2, "w2").gpus(2, 80 * GIB).build(),
        ],
        vec![PlacedClaim::uniform(100, 1, &[0], 60 * GIB, 0)],
    );
    let request = fixed_request(1, 1, 10 * GIB);
    let spread = ok(place(&snapshot, &request));
    assert_eq!(
        (spread.worker_name.as_str(), spread.gpu_indexes()),
        ("w2", vec![0])
    );
    // Binpack: w1 is fuller, and on it GPU 0 (20 GiB free) is left fullest after placing.
    let binpack = ok(place(&snapshot, &with_strategy(request, Strategy::Binpack)));
    assert_eq!(
        (binpack.worker_name.as_str(), binpack.gpu_indexes()),
        ("w1", vec![0])
    );
    assert_eq!(binpack.gpus[0].bytes, 10 * GIB);
    assert_eq!(binpack.kind, PlacementKind::SingleGpu);
}

#[test]
fn binpack_moves_on_when_the_fullest_worker_no_longer_fits() {
    let snapshot = cluster(
        vec![
            worker(1, "w1").gpus(1, 80 * GIB).build(),
            worker(2, "w2").gpus(2, 80 * GIB).build(),
        ],
        vec![PlacedClaim::uniform(100, 1, &[0], 75 * GIB, 0)],
    );
    let request = with_strategy(fixed_request(1, 1, 10 * GIB), Strategy::Binpack);
    assert_eq!(ok(place(&snapshot, &request)).worker_name, "w2");
}

#[test]
fn ties_break_by_worker_id_then_gpu_index() {
    // Listed out of id order on purpose.
    let snapshot = cluster(
        vec![
            worker(3, "w3").gpus(2, 80 * GIB).build(),
            worker(1, "w1").gpus(2, 80 * GIB).build(),
            worker(2, "w2").gpus(2, 80 * GIB).build(),
        ],
        vec![],
    );
    for strategy in [Strategy::Spread, Strategy::Binpack] {
        let placement = ok(place(
            &snapshot,
            &with_strategy(fixed_request(1, 1, GIB), strategy),
        ));
        assert_eq!(
            (placement.worker_id, placement.gpu_indexes()),
            (1, vec![0]),
            "{strategy:?}"
        );
    }
}

#[test]
fn spread_moves_to_the_next_worker_as_the_first_fills() {
    let snapshot = cluster(
        vec![
            worker(1, "w1").gpus(2, 80 * GIB).build(),
            worker(2, "w2").gpus(2, 80 * GIB).build(),
        ],
        vec![],
    );
    let mut state = SnapshotState::new(&snapshot);
    let placed: Vec<(i64, Vec<u32>)> = (0..4)
        .map(|i| {
            let p = ok(state.place(&fixed_request(i, 1, 10 * GIB)));
            (p.worker_id, p.gpu_indexes())
        })
        .collect();
    assert_eq!(
        placed,
        vec![(1, vec![0]), (2, vec![0]), (1, vec![1]), (2, vec![1])]
    );
    state.assert_consistent();
}

#[test]
fn non_ready_workers_are_never_chosen() {
    let snapshot = cluster(
        vec![
            worker(1, "w1").gpus(1, 80 * GIB).not_ready().build(),
            worker(2, "w2").gpus(1, 80 * GIB).build(),
        ],
        vec![PlacedClaim::uniform(100, 2, &[0], 70 * GIB, 0)],
    );
    assert_eq!(
        ok(place(&snapshot, &fixed_request(1, 1, 5 * GIB))).worker_id,
        2
    );
    let e = place(&snapshot, &fixed_request(1, 1, 20 * GIB)).expect_err("w1 is not ready");
    assert!(
        matches!(e, Unschedulable::InsufficientResources { .. }),
        "{e}"
    );

    let all_down = cluster(
        vec![worker(1, "w1").gpus(1, 80 * GIB).not_ready().build()],
        vec![],
    );
    let e = place(&all_down, &fixed_request(1, 1, GIB)).expect_err("nothing ready");
    assert_eq!(e, Unschedulable::NoReadyWorker { workers: 1 });
    assert_eq!(
        e.to_string(),
        "no ready worker (1 workers registered, none ready)"
    );
    let empty = cluster(vec![], vec![]);
    assert_eq!(
        place(&empty, &fixed_request(1, 1, GIB)),
        Err(Unschedulable::NoReadyWorker { workers: 0 })
    );
}

#[test]
fn selector_must_match_every_label() {
    let snapshot = cluster(
        vec![
            worker(1, "w1")
                .gpus(1, 80 * GIB)
                .label("app", "x")
                .label("zone", "a")
                .build(),
            worker(2, "w2").gpus(1, 80 * GIB).label("app", "x").build(),
            worker(3, "w3")
                .gpus(1, 80 * GIB)
                .label("app", "y")
                .not_ready()
                .build(),
        ],
        vec![],
    );
    let mut request = fixed_request(1, 1, GIB);
    request.selector.insert("app".to_owned(), "x".to_owned());
    request.selector.insert("zone".to_owned(), "a".to_owned());
    assert_eq!(ok(place(&snapshot, &request)).worker_id, 1);

    request.selector.insert("zone".to_owned(), "b".to_owned());
    let e = place(&snapshot, &request).expect_err("no zone b");
    assert_eq!(e.to_string(), "no worker matches selector app=x,zone=b");

    request.selector.clear();
    request.selector.insert("app".to_owned(), "y".to_owned());
    let e = place(&snapshot, &request).expect_err("w3 is not ready");
    assert_eq!(
        e,
        Unschedulable::NoReadyWorkerMatchesSelector {
            selector: "app=y".to_owned(),
            not_ready: 1
        }
    );
}

#[test]
fn backend_must_run_on_the_worker() {
    let snapshot = cluster(
        vec![
            worker(1, "w1")
                .gpus(1, 80 * GIB)
                .backends(&["llama.cpp"])
                .build(),
            worker(2, "w2")
                .gpus(1, 80 * GIB)
                .backends(&["vllm"])
                .label("app", "x")
                .build(),
        ],
        vec![],
    );
    let request = engine_request(1, 10 * GIB, 0.9);
    assert_eq!(ok(place(&snapshot, &request)).worker_id, 2);
    let mut elsewhere = request.clone();
    elsewhere.backend = "sglang".to_owned();
    let e = place(&snapshot, &elsewhere).expect_err("no sglang");
    assert_eq!(e.to_string(), "backend sglang runs on no ready worker");
    let mut selective = fixed_request(1, 1, GIB);
    selective.backend = "vllm".to_owned();
    selective.selector.insert("app".to_owned(), "x".to_owned());
    assert_eq!(ok(place(&snapshot, &selective)).worker_id, 2);
    selective.backend = "llama.cpp".to_owned();
    let e = place(&snapshot, &selective).expect_err("w2 has no llama.cpp");
    assert_eq!(
        e.to_string(),
        "backend llama.cpp runs on no ready worker matching selector app=x"
    );
}

#[test]
fn fit_is_against_total_minus_reserve_minus_placed_claims() {
    // 80 GiB GPU, 2 GiB reserved, 70 GiB placed: 8 GiB allocatable.
    let snapshot = cluster(
        vec![worker(1, "w1")
            .gpus(1, 80 * GIB)
            .reserve(2 * GIB, 0)
            .build()],
        vec![PlacedClaim::uniform(100, 1, &[0], 70 * GIB, 0)],
    );
    assert_eq!(
        SnapshotState::new(&snapshot).gpu_allocatable(1, 0),
        Some(8 * GIB)
    );
    assert!(place(&snapshot, &fixed_request(1, 1, 8 * GIB)).is_ok());
    let e = place(&snapshot, &fixed_request(1, 1, 8 * GIB + 1)).expect_err("one byte short");
    assert_eq!(
        e.to_string(),
        "no ready worker has 1 GPU with 8.0 GiB free; best: w1 has 0 (8.0 GiB free)"
    );
}

#[test]
fn ram_must_fit_too() {
    let snapshot = cluster(
        vec![worker(1, "w1")
            .gpus(1, 80 * GIB)
            .ram(16 * GIB)
            .reserve(0, 4 * GIB)
            .build()],
        vec![PlacedClaim::uniform(100, 1, &[], 0, 6 * GIB)],
    );
    let mut request = fixed_request(1, 1, GIB);
    request.claim.base_ram_bytes = 6 * GIB;
    assert_eq!(ok(place(&snapshot, &request)).ram_bytes, 6 * GIB);
    request.claim.base_ram_bytes = 7 * GIB;
    let e = place(&snapshot, &request).expect_err("6 GiB RAM left");
    assert_eq!(
        e.to_string(),
        "no ready worker has 1 GPU with 1.0 GiB free; best: w1 has the GPUs but 6.0 GiB RAM free of 7.0 GiB needed"
    );
}

#[test]
fn shortfall_message_names_the_need_and_the_best_candidate() {
    // w3: GPU 0 has 71.2 GiB free, GPU 1 has 30 GiB free; w1 has one 30 GiB GPU.
    let used = 80 * GIB - 712 * GIB / 10;
    let snapshot = cluster(
        vec![
            worker(1, "w1").gpus(1, 30 * GIB).build(),
            worker(3, "w3").gpus(2, 80 * GIB).build(),
        ],
        vec![
            PlacedClaim::uniform(100, 3, &[0], used, 0),
            PlacedClaim::uniform(101, 3, &[1], 50 * GIB, 0),
        ],
    );
    let e = place(&snapshot, &fixed_request(1, 2, 40 * GIB)).expect_err("one GPU short");
    assert_eq!(
        e.to_string(),
        "no ready worker has 2 GPUs with 40.0 GiB free; best: w3 has 1 (71.2 GiB free)"
    );
    assert!(e.may_succeed_later());
}

#[test]
fn llama_cpp_splits_blocks_over_gpus_when_one_is_too_small() {
    // 4 blocks of 30 GiB, output 2 GiB, 1 GiB overhead per GPU: 123 GiB on one GPU.
    let snapshot = cluster(vec![worker(1, "w1").gpus(4, 80 * GIB).build()], vec![]);
    let request = layered_request(1, 4, 30 * GIB, 2 * GIB, GIB, GIB, GIB);
    let placement = ok(place(&snapshot, &request));
    assert_eq!(placement.kind, PlacementKind::MultiGpu);
    assert_eq!(placement.tensor_parallel_size, 2);
    // GPU 0: 1 + 60 = 61 GiB; GPU 1: 1 + 60 + 2 (output) = 63 GiB.
    assert_eq!(
        placement.gpus.iter().map(|g| g.bytes).collect::<Vec<_>>(),
        vec![61 * GIB, 63 * GIB]
    );
    assert_eq!(
        placement.llama,
        Some(LlamaLayout {
            n_gpu_layers: 5,
            tensor_split: vec![2, 3]
        })
    );
    // Full offload: only the base RAM.
    assert_eq!(placement.ram_bytes, GIB);

    let mut single = request;
    single.allow_tensor_parallel = false;
    let e = place(&snapshot, &single).expect_err("123 GiB on one GPU");
    assert_eq!(
        e.to_string(),
        "no ready worker has 1 GPU with 123.0 GiB free; best: w1 has 0 (80.0 GiB free)"
    );
}

#[test]
fn one_gpu_is_preferred_over_a_split() {
    let snapshot = cluster(
        vec![
            worker(1, "w1").gpus(2, 40 * GIB).build(),
            worker(2, "w2").gpus(1, 24 * GIB).build(),
        ],
        vec![],
    );
    // 30 GiB fits one 40 GiB GPU of w1; Spread would prefer w1 anyway, Binpack too (only fit).
    let request = layered_request(1, 3, 10 * GIB, 0, 0, 0, 0);
    let placement = ok(place(&snapshot, &request));
    assert_eq!((placement.worker_id, placement.gpus.len()), (1, 1));
}

#[test]
fn engine_claims_its_fraction_of_each_gpu_and_picks_a_tensor_parallel_size() {
    let snapshot = cluster(vec![worker(1, "w1").gpus(4, 80 * GIB).build()], vec![]);
    // 100 GiB of weights + 1 GiB overhead: tp 1 needs 101 GiB > 72 GiB; tp 2 needs 51 GiB.
    let placement = ok(place(&snapshot, &engine_request(1, 100 * GIB, 0.9)));
    assert_eq!(placement.tensor_parallel_size, 2);
    assert_eq!(placement.data_parallel_size, 1);
    assert_eq!(placement.kind, PlacementKind::MultiGpu);
    assert_eq!(
        placement.gpus.iter().map(|g| g.bytes).collect::<Vec<_>>(),
        vec![72 * GIB; 2]
    );
    assert_eq!(placement.ram_bytes, 4 * GIB);
    assert_eq!(placement.llama, None);
}

#[test]
fn engine_fraction_must_fit_the_free_memory_and_hold_the_minimum() {
    // A small model still claims 90% of a GPU: a GPU with 10 GiB used has only 70 GiB free.
    let snapshot = cluster(
        vec![worker(1, "w1").gpus(2, 80 * GIB).build()],
        vec![PlacedClaim::uniform(100, 1, &[0], 10 * GIB, 0)],
    );
    let placement = ok(place(&snapshot, &engine_request(1, GIB, 0.9)));
    assert_eq!(placement.gpu_indexes(), vec![1]);
    // 24 GiB GPUs: 90% is 21.6 GiB, too little for 30 GiB + 1 GiB on one; 2 × 16 GiB fits.
    let small = cluster(vec![worker(1, "w1").gpus(2, 24 * GIB).build()], vec![]);
    let placement = ok(place(&small, &engine_request(1, 30 * GIB, 0.9)));
    assert_eq!(placement.tensor_parallel_size, 2);
    let share = (0.9 * (24 * GIB) as f64).floor() as u64;
    assert_eq!(
        placement.gpus.iter().map(|g| g.bytes).collect::<Vec<_>>(),
        vec![share; 2]
    );
    let e = place(&small, &engine_request(1, 60 * GIB, 0.9)).expect_err("31 GiB per GPU");
    assert_eq!(
        e.to_string(),
        "no ready worker has 1 GPU with 90% of memory free (at least 61.0 GiB each) or \
         2 GPUs with 90% of memory free (at least 31.0 GiB each); best: w1 has 0 (24.0 GiB free)"
    );
}

#[test]
fn engine_data_parallel_places_replicas_on_one_worker() {
    let snapshot = cluster(
        vec![
            worker(1, "w1").gpus(2, 80 * GIB).build(),
            worker(2, "w2").gpus(4, 80 * GIB).build(),
        ],
        vec![],
    );
    let mut request = engine_request(1, 100 * GIB, 0.9);
    request.data_parallel_size = Some(2);
    let placement = ok(place(&snapshot, &request));
    assert_eq!(placement.worker_id, 2);
    assert_eq!(
        (placement.tensor_parallel_size, placement.data_parallel_size),
        (2, 2)
    );
    assert_eq!(placement.gpus.len(), 4);
    assert_eq!(placement.ram_bytes, 8 * GIB, "one process per replica");
}

#[test]
fn engine_fixed_tensor_parallel_size_is_honoured() {
    let snapshot = cluster(vec![worker(1, "w1").gpus(4, 80 * GIB).build()], vec![]);
    let mut request = engine_request(1, GIB, 0.9);
    if let ModelMemory::Engine(engine) = &mut request.claim.memory {
        engine.fixed_tensor_parallel_size = Some(4);
    }
    assert_eq!(ok(place(&snapshot, &request)).tensor_parallel_size, 4);
    if let ModelMemory::Engine(engine) = &mut request.claim.memory {
        engine.fixed_tensor_parallel_size = Some(8);
    }
    let e = place(&snapshot, &request).expect_err("8 GPUs on a 4-GPU worker");
    assert!(
        e.to_string().starts_with("no ready worker has 8 GPUs"),
        "{e}"
    );
}

#[test]
fn engine_fixed_tensor_parallel_size_the_model_rejects_is_an_invalid_request() {
    // Found by the property test: 32 heads cannot be split 3 ways, so `--tp 3` must not be
    // placed even when a claim arrives without going through estimation.
    let snapshot = cluster(vec![worker(1, "w1").gpus(4, 80 * GIB).build()], vec![]);
    let mut request = engine_request(1, GIB, 0.9);
    if let ModelMemory::Engine(engine) = &mut request.claim.memory {
        engine.fixed_tensor_parallel_size = Some(3);
    }
    let e = place(&snapshot, &request).expect_err("3 does not divide 32 heads");
    assert!(matches!(e, Unschedulable::InvalidRequest { .. }), "{e}");
    assert!(!e.may_succeed_later());
}

#[test]
fn partial_offload_puts_as_many_blocks_as_fit_on_one_gpu() {
    // 10 blocks of 10 GiB, output 1 GiB, 1 GiB overhead, base RAM 2 GiB, host compute 1 GiB.
    let snapshot = cluster(vec![worker(1, "w1").gpus(1, 48 * GIB).build()], vec![]);
    let mut request = layered_request(1, 10, 10 * GIB, GIB, GIB, 2 * GIB, GIB);
    let e = place(&snapshot, &request).expect_err("offload not allowed");
    assert!(matches!(e, Unschedulable::InsufficientResources { .. }));
    request.allow_cpu_offload = true;
    let placement = ok(place(&snapshot, &request));
    // 1 + 10 × b ≤ 48 → b = 4 blocks (41 GiB) on the GPU.
    assert_eq!(placement.kind, PlacementKind::PartialOffload);
    assert_eq!(
        placement.llama,
        Some(LlamaLayout {
            n_gpu_layers: 4,
            tensor_split: vec![4]
        })
    );
    assert_eq!(placement.gpus[0].bytes, 41 * GIB);
    // RAM: 2 base + 6 blocks × 10 + 1 output + 1 host compute = 64 GiB.
    assert_eq!(placement.ram_bytes, 64 * GIB);
}

#[test]
fn partial_offload_prefers_the_gpu_holding_the_most_blocks() {
    let snapshot = cluster(
        vec![
            worker(1, "w1").gpus(1, 24 * GIB).build(),
            worker(2, "w2").gpus(1, 48 * GIB).build(),
        ],
        vec![],
    );
    let mut request = with_strategy(
        layered_request(1, 10, 10 * GIB, GIB, GIB, 2 * GIB, GIB),
        Strategy::Binpack,
    );
    request.allow_cpu_offload = true;
    let placement = ok(place(&snapshot, &request));
    assert_eq!(placement.worker_id, 2, "4 blocks beat 2 even under binpack");
}

#[test]
fn cpu_only_when_no_gpu_holds_a_block() {
    let snapshot = cluster(
        vec![
            worker(1, "w1").ram(64 * GIB).build(),
            worker(2, "w2").ram(128 * GIB).build(),
        ],
        vec![],
    );
    let mut request = layered_request(1, 4, 10 * GIB, GIB, GIB, 2 * GIB, GIB);
    request.allow_cpu_offload = true;
    let placement = ok(place(&snapshot, &request));
    assert_eq!(placement.kind, PlacementKind::CpuOnly);
    assert_eq!(placement.worker_id, 2, "spread: the most RAM");
    assert!(placement.gpus.is_empty());
    // 2 base + 40 blocks + 1 output + 1 host compute.
    assert_eq!(placement.ram_bytes, 44 * GIB);
    assert_eq!(placement.llama.as_ref().map(|l| l.n_gpu_layers), Some(0));
    let binpack = ok(place(&snapshot, &with_strategy(request, Strategy::Binpack)));
    assert_eq!(binpack.worker_id, 1, "binpack: the least RAM that fits");
}

#[test]
fn user_fixed_gpu_layers_are_kept() {
    let snapshot = cluster(vec![worker(1, "w1").gpus(1, 80 * GIB).build()], vec![]);
    let mut request = layered_request(1, 4, 10 * GIB, GIB, GIB, 2 * GIB, GIB);
    if let ModelMemory::Layers(layers) = &mut request.claim.memory {
        layers.fixed_gpu_layers = Some(2);
    }
    let placement = ok(place(&snapshot, &request));
    assert_eq!(placement.kind, PlacementKind::PartialOffload);
    assert_eq!(placement.gpus[0].bytes, 21 * GIB);
    // 2 base + 2 host blocks + 1 output + 1 host compute.
    assert_eq!(placement.ram_bytes, 24 * GIB);
    if let ModelMemory::Layers(layers) = &mut request.claim.memory {
        layers.fixed_gpu_layers = Some(0);
    }
    let placement = ok(place(&snapshot, &request));
    assert_eq!(placement.kind, PlacementKind::CpuOnly);
}

#[test]
fn manual_selection_uses_exactly_the_given_gpus() {
    let snapshot = cluster(
        vec![
            worker(1, "w1").gpus(4, 80 * GIB).build(),
            worker(2, "w2").gpus(1, 80 * GIB).not_ready().build(),
        ],
        vec![PlacedClaim::uniform(100, 1, &[1], 70 * GIB, 0)],
    );
    let mut request = fixed_request(1, 2, 20 * GIB);
    request.manual = Some(ManualGpuSelection {
        worker_name: "w1".to_owned(),
        gpu_indexes: vec![3, 2],
    });
    let placement = ok(place(&snapshot, &request));
    assert_eq!(placement.gpu_indexes(), vec![2, 3]);

    let refuse = |worker: &str, indexes: Vec<u32>| {
        let mut r = request.clone();
        r.manual = Some(ManualGpuSelection {
            worker_name: worker.to_owned(),
            gpu_indexes: indexes,
        });
        place(&snapshot, &r).expect_err("refused").to_string()
    };
    assert_eq!(
        refuse("w9", vec![0, 1]),
        "manual GPU selection on w9: worker w9 does not exist"
    );
    assert_eq!(
        refuse("w2", vec![0, 1]),
        "manual GPU selection on w2: worker w2 is not ready"
    );
    assert_eq!(
        refuse("w1", vec![0, 7]),
        "manual GPU selection on w1: worker w1 has no GPU 7"
    );
    assert_eq!(
        refuse("w1", vec![0, 1]),
        "manual GPU selection on w1: GPU 1 on w1 has 10.0 GiB free, needs 20.0 GiB"
    );
    assert_eq!(
        refuse("w1", vec![0]),
        "manual GPU selection on w1: the model cannot run on 1 GPU(s); valid GPU counts here: 2"
    );
    assert_eq!(
        refuse("w1", vec![0, 0]),
        "manual GPU selection on w1: a GPU index is given twice"
    );
}

#[test]
fn manual_selection_on_one_gpu_may_partially_offload() {
    let snapshot = cluster(vec![worker(1, "w1").gpus(2, 48 * GIB).build()], vec![]);
    let mut request = layered_request(1, 10, 10 * GIB, GIB, GIB, 2 * GIB, GIB);
    request.allow_cpu_offload = true;
    request.manual = Some(ManualGpuSelection {
        worker_name: "w1".to_owned(),
        gpu_indexes: vec![1],
    });
    let placement = ok(place(&snapshot, &request));
    assert_eq!(placement.gpu_indexes(), vec![1]);
    assert_eq!(placement.llama.map(|l| l.n_gpu_layers), Some(4));
}

#[test]
fn place_many_never_double_books() {
    let snapshot = cluster(vec![worker(1, "w1").gpus(1, 80 * GIB).build()], vec![]);
    let mut state = SnapshotState::new(&snapshot);
    let results = crate::place_many(
        &mut state,
        &[
            fixed_request(1, 1, 50 * GIB),
            fixed_request(2, 1, 50 * GIB),
            fixed_request(3, 1, 30 * GIB),
        ],
    );
    assert!(results[0].is_ok());
    assert!(results[1].is_err(), "only 30 GiB left");
    assert!(results[2].is_ok());
    assert_eq!(state.gpu_allocatable(1, 0), Some(0));
    state.assert_consistent();
}

#[test]
fn release_and_apply_move_the_ledger() {
    let snapshot = cluster(
        vec![worker(1, "w1").gpus(1, 80 * GIB).ram(64 * GIB).build()],
        vec![],
    );
    let mut state = SnapshotState::new(&snapshot);
    let mut request = fixed_request(1, 1, 50 * GIB);
    request.claim.base_ram_bytes = 10 * GIB;
    let placement = ok(state.place(&request));
    assert_eq!(state.gpu_allocatable(1, 0), Some(30 * GIB));
    assert_eq!(state.ram_allocatable(1), Some(54 * GIB));
    state.release(&PlacedClaim::from(&placement));
    assert_eq!(state.gpu_allocatable(1, 0), Some(80 * GIB));
    assert_eq!(state.ram_allocatable(1), Some(64 * GIB));
    // Releasing twice never creates memory beyond the capacity.
    state.release(&PlacedClaim::from(&placement));
    assert_eq!(state.gpu_allocatable(1, 0), Some(80 * GIB));
    state.apply(&PlacedClaim::uniform(7, 1, &[0], 100 * GIB, 0));
    assert_eq!(
        state.gpu_allocatable(1, 0),
        Some(0),
        "over-subscription saturates"
    );
    state.assert_consistent();
}

#[test]
fn place_is_pure_and_deterministic() {
    let snapshot = cluster(
        vec![
            worker(2, "w2").gpus(2, 80 * GIB).build(),
            worker(1, "w1").gpus(2, 80 * GIB).build(),
        ],
        vec![],
    );
    let request = fixed_request(1, 1, 10 * GIB);
    let first = place(&snapshot, &request);
    assert_eq!(first, place(&snapshot, &request));
    assert_eq!(ok(first).worker_id, 1);
}

#[test]
fn workers_with_the_backend_installed_come_first_and_the_rest_can_still_install_it() {
    // w2 is emptier, so spread would pick it; w1 has the version installed.
    let snapshot = cluster(
        vec![
            worker(1, "w1")
                .gpus(1, 80 * GIB)
                .installed(&["llama.cpp", "llama.cpp@2"])
                .build(),
            worker(2, "w2").gpus(1, 80 * GIB).build(),
        ],
        vec![PlacedClaim::uniform(100, 1, &[0], 40 * GIB, 0)],
    );
    let mut request = fixed_request(1, 1, 10 * GIB);
    request.prefer_installed = Some("llama.cpp@2".to_owned());
    assert_eq!(ok(place(&snapshot, &request)).worker_name, "w1");
    // A version installed nowhere: the usual order.
    request.prefer_installed = Some("llama.cpp@3".to_owned());
    assert_eq!(ok(place(&snapshot, &request)).worker_name, "w2");
    // Installed, but it does not fit there: placed where it can be installed.
    let mut big = fixed_request(1, 1, 60 * GIB);
    big.prefer_installed = Some("llama.cpp@2".to_owned());
    assert_eq!(ok(place(&snapshot, &big)).worker_name, "w2");
}
