//! The API server's state: objects per kind, a change history by
//! resourceVersion (compactable), open watches and request counts.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedSender;

use super::selectors::Filter;
use super::Kind;

pub(super) struct Change {
    rv: u64,
    kind: Kind,
    old: Option<Value>,
    new: Option<Value>,
}

pub(super) struct Watch {
    pub kind: Kind,
    pub filter: Filter,
    pub meta_only: bool,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    pub tx: UnboundedSender<Bytes>,
}

#[derive(Default)]
pub(super) struct State {
    pub rv: u64,
    /// Changes at or below this resourceVersion are forgotten: older
    /// watches and exact lists get 410 Gone.
    pub compacted: u64,
    pub objects: HashMap<Kind, BTreeMap<(String, String), Value>>,
    history: Vec<Change>,
    pub watches: Vec<Watch>,
    pub requests: HashMap<(Kind, &'static str), u64>,
    /// Requests that asked for metadata only (`as=PartialObjectMetadata...`).
    pub metadata_only: HashMap<Kind, u64>,
    pub authorizations: Vec<String>,
    /// While set, list and watch requests fail with 500 (an API outage).
    pub unavailable: bool,
    /// Resources answered with 404 (a CRD not installed).
    pub absent: std::collections::HashSet<Kind>,
    /// Secrets, ConfigMaps and the tokens TokenReview knows.
    pub named: super::writes::Named,
}

fn key(obj: &Value) -> (String, String) {
    let m = &obj["metadata"];
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (s(&m["namespace"]), s(&m["name"]))
}

/// What a watch (or a metadata-only list) sends for `obj`.
pub(super) fn view(obj: &Value, meta_only: bool) -> Value {
    if meta_only {
        json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": obj["metadata"],
        })
    } else {
        obj.clone()
    }
}

pub(super) fn event(kind: &str, obj: Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap();
    line.push(b'\n');
    Bytes::from(line)
}

impl State {
    /// Stores `obj` (a create when `old` is `None`), stamps its
    /// resourceVersion and tells the watches.
    pub fn put(&mut self, kind: Kind, mut obj: Value) -> Value {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        obj["apiVersion"] = json!(kind.api_version());
        obj["kind"] = json!(kind.name());
        let old = self
            .objects
            .entry(kind)
            .or_default()
            .insert(key(&obj), obj.clone());
        self.record(kind, old, Some(obj.clone()));
        obj
    }

    pub fn remove(&mut self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        let mut old = self
            .objects
            .get_mut(&kind)?
            .remove(&(ns.to_owned(), name.to_owned()))?;
        self.rv += 1;
        old["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(kind, Some(old.clone()), None);
        Some(old)
    }

    fn record(&mut self, kind: Kind, old: Option<Value>, new: Option<Value>) {
        let change = Change {
            rv: self.rv,
            kind,
            old,
            new,
        };
        self.watches.retain(|w| match w.kind == kind {
            true => send(w, &change),
            false => !w.tx.is_closed(),
        });
        self.history.push(change);
    }

    /// Replays history after `since` into a new watch and registers it.
    pub fn watch(&mut self, w: Watch, since: u64) {
        for c in self
            .history
            .iter()
            .filter(|c| c.rv > since && c.kind == w.kind)
        {
            send(&w, c);
        }
        if w.bookmarks {
            let bm = json!({
                "apiVersion": w.kind.api_version(),
                "kind": w.kind.name(),
                "metadata": {"resourceVersion": self.rv.to_string()},
            });
            let _ = w.tx.send(event("BOOKMARK", bm));
        }
        self.watches.push(w);
    }

    /// Sends every watch that asked for bookmarks a BOOKMARK at the current
    /// resourceVersion (what the API server does about once a minute).
    pub fn bookmark_all(&mut self) {
        let rv = self.rv.to_string();
        self.watches.retain(|w| {
            let bm = json!({
                "apiVersion": w.kind.api_version(),
                "kind": w.kind.name(),
                "metadata": {"resourceVersion": rv},
            });
            !w.bookmarks || w.tx.send(event("BOOKMARK", bm)).is_ok()
        });
    }

    pub fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
    }

    pub fn list(&self, kind: Kind, filter: &Filter) -> Vec<Value> {
        self.objects
            .get(&kind)
            .map(|m| m.values().filter(|o| filter.matches(o)).cloned().collect())
            .unwrap_or_default()
    }
}

/// Sends `c` to `w` as the API server would: a change that moves an object
/// into or out of the watch's selectors is an ADDED or DELETED. False when
/// the watch is gone.
fn send(w: &Watch, c: &Change) -> bool {
    let was = c.old.as_ref().is_some_and(|o| w.filter.matches(o));
    let is = c.new.as_ref().is_some_and(|o| w.filter.matches(o));
    let (kind, obj) = match (was, is) {
        (false, true) => ("ADDED", c.new.as_ref()),
        (true, true) => ("MODIFIED", c.new.as_ref()),
        (true, false) => ("DELETED", c.new.as_ref().or(c.old.as_ref())),
        (false, false) => return !w.tx.is_closed(),
    };
    let mut obj = obj.unwrap().clone();
    obj["metadata"]["resourceVersion"] = json!(c.rv.to_string());
    w.tx.send(event(kind, view(&obj, w.meta_only))).is_ok()
}
