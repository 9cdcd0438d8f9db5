//! The metrics of `metrics.authorization: kubernetes`'s token reviews
//! (`dxdp_metrics_token_reviews_total{result}`): how many bearer tokens were sent to the API
//! server, and how many were answered locally without asking (`cluster::metrics_authz`).
//!
//! Names and labels are a public interface; `docs/observability.md` lists them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// What became of a bearer token that no cached decision answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReviewResult {
    /// A TokenReview (and, for a valid token, a SubjectAccessReview) was sent.
    Asked,
    /// The same token's review was in flight: its answer was awaited, nothing more sent.
    Shared,
    /// Not token-shaped or oversized: refused (401) without asking.
    Malformed,
    /// Over the review rate: refused (503) without asking.
    Limited,
}

impl ReviewResult {
    /// Every result.
    pub(crate) const ALL: [ReviewResult; 4] = [
        ReviewResult::Asked,
        ReviewResult::Shared,
        ReviewResult::Malformed,
        ReviewResult::Limited,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReviewResult::Asked => "asked",
            ReviewResult::Shared => "shared",
            ReviewResult::Malformed => "malformed",
            ReviewResult::Limited => "limited",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// The token reviews' counters (a default value counts without being registered).
#[derive(Debug, Clone, Default)]
pub(crate) struct ReviewMetrics {
    reviews: Family<ResultLabel, Counter>,
}

impl ReviewMetrics {
    /// Registers them in `registry`, every series at 0.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let reviews = Family::<ResultLabel, Counter>::default();
        registry.register(
            "dxdp_metrics_token_reviews",
            "Bearer tokens of /metrics requests that no cached decision answered (metrics.authorization: kubernetes), by result: asked (reviewed by the API server), shared (waited for the same token's review in flight), malformed and limited (refused without asking)",
            reviews.clone(),
        );
        for r in ReviewResult::ALL {
            drop(reviews.get_or_create(&ResultLabel {
                result: r.as_str().into(),
            }));
        }
        ReviewMetrics { reviews }
    }

    /// Counts one `result`.
    pub(crate) fn count(&self, result: ReviewResult) {
        self.reviews
            .get_or_create(&ResultLabel {
                result: result.as_str().into(),
            })
            .inc();
    }

    /// How many of `result` were counted.
    #[cfg(test)]
    pub(crate) fn get(&self, result: ReviewResult) -> u64 {
        self.reviews
            .get_or_create(&ResultLabel {
                result: result.as_str().into(),
            })
            .get()
    }
}
