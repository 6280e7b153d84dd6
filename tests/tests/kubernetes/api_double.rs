//! The API server double itself (`tidegate_e2e::kube_api`), driven by
//! kube's client directly: the list and watch protocols.

use super::*;

/// The double itself, driven by kube's client directly: selectors,
/// pagination, metadata-only lists, 400 on selectors it cannot evaluate,
/// 410 on an exact list from a compacted resourceVersion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_double_speaks_the_list_protocol() {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use kube::api::{ListParams, VersionMatch};
    use kube::core::PartialObjectMeta;
    let api = FakeApiServer::start().await;
    for i in 1..=5u8 {
        let node = if i <= 3 { "node-a" } else { "node-b" };
        let mut p = pod(&format!("p{i}"), &format!("u{i}"), node, ip(68, i));
        if i % 2 == 0 {
            p["metadata"]["labels"]["tier"] = json!("db");
        }
        api.apply(Kind::Pod, p);
    }
    api.apply(Kind::Namespace, namespace("demo", json!({"team": "x"})));
    let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let pods: kube::Api<Pod> = kube::Api::all(client.clone());
    let names = |l: kube::core::ObjectList<Pod>| -> Vec<String> {
        l.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect()
    };
    let on_a = pods
        .list(&ListParams::default().fields("spec.nodeName=node-a"))
        .await
        .unwrap();
    assert_eq!(names(on_a), ["p1", "p2", "p3"]);
    let not_a = pods
        .list(&ListParams::default().fields("spec.nodeName!=node-a"))
        .await
        .unwrap();
    assert_eq!(names(not_a), ["p4", "p5"]);
    let one = pods
        .list(&ListParams::default().fields("metadata.name=p5"))
        .await
        .unwrap();
    assert_eq!(names(one), ["p5"]);
    let db = pods
        .list(&ListParams::default().labels("tier=db,app"))
        .await
        .unwrap();
    assert_eq!(names(db), ["p2", "p4"]);
    let not_db = pods
        .list(&ListParams::default().labels("!tier"))
        .await
        .unwrap();
    assert_eq!(names(not_db), ["p1", "p3", "p5"]);
    // Pagination: limit + continue.
    let first = pods.list(&ListParams::default().limit(2)).await.unwrap();
    let token = first.metadata.continue_.clone().expect("a continue token");
    let rest = pods
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(
        [names(first), names(rest)].concat(),
        ["p1", "p2", "p3", "p4", "p5"]
    );
    // Metadata only.
    let ns: kube::Api<PartialObjectMeta<Namespace>> = kube::Api::all(client.clone());
    let meta = ns.list(&ListParams::default()).await.unwrap();
    assert_eq!(meta.items[0].metadata.labels.as_ref().unwrap()["team"], "x");
    assert_eq!(api.metadata_only_requests(Kind::Namespace), 1);
    // Errors are Status objects with the right code.
    let e = pods
        .list(&ListParams::default().labels("tier in (db)"))
        .await
        .unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 400), "{e}");
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.apply(Kind::Pod, pod("p6", "u6", "node-b", ip(68, 6)));
    api.compact();
    let stale = ListParams::default().at(&rv).matching(VersionMatch::Exact);
    let e = pods.list(&stale).await.unwrap_err();
    assert!(
        matches!(&e, kube::Error::Api(s) if s.code == 410 && s.reason == "Expired"),
        "{e}"
    );
}

/// Watch streams, driven by kube's client directly: ADDED / MODIFIED /
/// DELETED (also when a change moves an object out of the selector), and
/// the stream ends after `timeoutSeconds`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_double_speaks_the_watch_protocol() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{WatchEvent, WatchParams};
    let api = FakeApiServer::start().await;
    api.apply(Kind::Pod, pod("a", "ua", "node-a", ip(75, 2)));
    let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let pods: kube::Api<Pod> = kube::Api::all(client);
    let rv = pods
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let params = WatchParams::default().labels("app").timeout(1);
    let mut events = pods.watch(&params, &rv).await.unwrap().boxed();
    api.apply(Kind::Pod, pod("b", "ub", "node-a", ip(75, 3)));
    api.modify(Kind::Pod, "demo", "b", |p| {
        p["metadata"]["annotations"] = json!({"x": "1"});
    });
    api.modify(Kind::Pod, "demo", "a", |p| {
        p["metadata"]["labels"] = json!({});
    });
    api.delete(Kind::Pod, "demo", "b");
    let mut seen = Vec::new();
    // Ends by itself after timeoutSeconds=1.
    while let Some(e) = tokio::time::timeout(WAIT, events.next()).await.unwrap() {
        seen.push(match e.unwrap() {
            WatchEvent::Added(p) => format!("ADDED {}", p.metadata.name.unwrap()),
            WatchEvent::Modified(p) => format!("MODIFIED {}", p.metadata.name.unwrap()),
            WatchEvent::Deleted(p) => format!("DELETED {}", p.metadata.name.unwrap()),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(s) => panic!("{s:?}"),
        });
    }
    assert_eq!(seen, ["ADDED b", "MODIFIED b", "DELETED a", "DELETED b"]);
}
