//! Usage over time on both engines: sums per bucket (`usage_series`) and the roll-up of
//! old minutes into days (`roll_up_usage`), which must neither lose nor double a count,
//! also when two stores roll the same days up at once.

use gantry_store::{UsageFilter, UsageIncrement, UsageSums, USAGE_BUCKET_MILLIS, USAGE_DAY_MILLIS};
use gantry_testkit::{test_both_engines, TestDatabase, TestEngine};
use gantry_types::Timestamp;

const HOUR: i64 = 3_600_000;
/// Midnight UTC, some day in 2023.
const DAY0: i64 = 19_700 * USAGE_DAY_MILLIS;

fn sums(requests: u64, prompt: u64, completion: u64) -> UsageSums {
    UsageSums {
        requests,
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
    }
}

fn at(millis: i64, key: Option<i64>, model: &str, s: UsageSums) -> UsageIncrement {
    UsageIncrement {
        minute_start: Timestamp::from_millis(millis),
        user_id: 1,
        api_key_id: key,
        model: model.to_owned(),
        target: model.to_owned(),
        sums: s,
    }
}

fn total(points: &[gantry_store::UsagePoint]) -> UsageSums {
    let mut sum = UsageSums::default();
    for point in points {
        sum.add(&point.usage.sums);
    }
    sum
}

async fn usage_is_summed_per_bucket_key_and_model(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    store
        .add_usage(&[
            at(DAY0 + 5 * USAGE_BUCKET_MILLIS, Some(7), "a", sums(1, 10, 5)),
            at(DAY0 + 50 * USAGE_BUCKET_MILLIS, Some(7), "a", sums(2, 4, 4)),
            at(DAY0 + 50 * USAGE_BUCKET_MILLIS, None, "a", sums(1, 1, 1)),
            at(DAY0 + HOUR + 1, Some(7), "b", sums(3, 3, 3)),
        ])
        .await
        .unwrap();
    let hourly = store
        .usage_series(&UsageFilter::default(), HOUR)
        .await
        .unwrap();
    let shape: Vec<(i64, Option<i64>, &str, u64, u64)> = hourly
        .iter()
        .map(|p| {
            (
                p.start.as_millis() - DAY0,
                p.usage.api_key_id,
                p.usage.model.as_str(),
                p.usage.sums.requests,
                p.usage.sums.total_tokens,
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (0, None, "a", 1, 2),
            (0, Some(7), "a", 3, 23),
            (HOUR, Some(7), "b", 3, 6),
        ]
    );
    // The filter applies: one model, a window.
    let filter = UsageFilter {
        model: Some("a".into()),
        from: Some(Timestamp::from_millis(DAY0 + 10 * USAGE_BUCKET_MILLIS)),
        ..Default::default()
    };
    let minutes = store
        .usage_series(&filter, USAGE_BUCKET_MILLIS)
        .await
        .unwrap();
    assert_eq!(minutes.len(), 2);
    assert!(minutes
        .iter()
        .all(|p| p.start.as_millis() == DAY0 + 50 * USAGE_BUCKET_MILLIS));
}

async fn old_minutes_roll_up_into_days_and_keep_every_count(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    // Two whole days of traffic, and the day that is still open.
    let mut increments = Vec::new();
    for day in 0..3 {
        for minute in [0, 1, 59, 600, 1439] {
            let start = DAY0 + day * USAGE_DAY_MILLIS + minute * USAGE_BUCKET_MILLIS;
            increments.push(at(start, Some(7), "a", sums(1, 2, 3)));
            increments.push(at(start, None, "b", sums(2, 1, 1)));
        }
    }
    store.add_usage(&increments).await.unwrap();
    let everything = UsageFilter::default();
    let before = total(
        &store
            .usage_series(&everything, USAGE_DAY_MILLIS)
            .await
            .unwrap(),
    );

    // Two stores at once, as two servers would: every count once.
    let other = db.open().await;
    let cutoff = Timestamp::from_millis(DAY0 + 2 * USAGE_DAY_MILLIS + 5 * HOUR);
    let (one, two) = tokio::join!(store.roll_up_usage(cutoff), other.roll_up_usage(cutoff));
    // Of each closed day's 10 rows, the 2 at its first minute take the others' sums.
    assert_eq!(one.unwrap() + two.unwrap(), 2 * 8);

    let daily = store
        .usage_series(&everything, USAGE_DAY_MILLIS)
        .await
        .unwrap();
    assert_eq!(total(&daily), before, "no count lost or doubled");
    let minutes = store
        .usage_series(&everything, USAGE_BUCKET_MILLIS)
        .await
        .unwrap();
    // Closed days: one row per key and model at midnight; the open day keeps its minutes.
    let closed: Vec<_> = minutes
        .iter()
        .filter(|p| p.start.as_millis() < DAY0 + 2 * USAGE_DAY_MILLIS)
        .collect();
    assert_eq!(closed.len(), 4);
    assert!(closed
        .iter()
        .all(|p| p.start.as_millis() % USAGE_DAY_MILLIS == 0));
    let key_a = closed
        .iter()
        .find(|p| p.usage.model == "a" && p.start.as_millis() == DAY0)
        .unwrap();
    assert_eq!(key_a.usage.sums, sums(5, 10, 15));
    assert_eq!(minutes.len() - closed.len(), 10);
    // Nothing left to do.
    assert_eq!(store.roll_up_usage(cutoff).await.unwrap(), 0);
}

test_both_engines!(
    usage_is_summed_per_bucket_key_and_model,
    old_minutes_roll_up_into_days_and_keep_every_count,
);
