"""Cases transcribed from Kubernetes' Job controller tests, as data: Job spec + pods -> status.

Source: kubernetes/kubernetes ``pkg/controller/job/job_controller_test.go`` (commit 003e862),
test function and case name beside each. Where upstream has variants per feature gate, the
variant of the defaults since 1.31 is taken (JobPodReplacementPolicy, JobManagedBy and
JobSuccessPolicy on: interim ``FailureTarget`` / ``SuccessCriteriaMet`` conditions, terminal
conditions delayed while pods terminate). Pods are written ``(name, index, phase, extra)``; upstream
names them ``mypod-<i>``. ``want`` lists only what the upstream case asserts (conditions are
``(type, reason, message)``; ``None`` = not asserted).
"""

from __future__ import annotations

MAX_INT32 = 2**31 - 1  # backoffLimit's default beside backoffLimitPerIndex

PFP = "TestSyncJobWithJobPodFailurePolicy"
BLPI = "TestSyncJobWithJobBackoffLimitPerIndex"
SP = "TestSyncJobWithJobSuccessPolicy"
CSJ = "TestControllerSyncJob"

# onExitCodeRules in TestSyncJobWithJobPodFailurePolicy
ON_EXIT_CODE_RULES = [
    {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [1, 2, 3]}},
    {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [5, 6, 7]}},
]
DISRUPTION = [{"type": "DisruptionTarget", "status": "True"}]
BACKOFF = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
FAILED_INDEXES = ("FailedIndexes", "Job has failed indexes")
MAX_FAILED = (
    "MaxFailedIndexesExceeded",
    "Job has exceeded the specified maximal number of failed indexes",
)
DONE = ("CompletionsReached", "Reached expected number of succeeded pods")


def fail_job(message: str) -> list[tuple[str, str, str]]:
    return [("FailureTarget", "PodFailurePolicy", message), ("Failed", "PodFailurePolicy", message)]


def job(parallelism: int = 1, completions: int = 1, backoff_limit: int | None = 6, **spec) -> dict:
    out = {"parallelism": parallelism, "completions": completions, **spec}
    if backoff_limit is not None:
        out["backoffLimit"] = backoff_limit
    return out


def per_index(
    parallelism: int = 2, completions: int = 2, backoff_limit: int = MAX_INT32, **spec
) -> dict:
    return job(
        parallelism,
        completions,
        backoff_limit,
        completionMode="Indexed",
        backoffLimitPerIndex=1,
        **spec,
    )


CASES: list[dict] = [
    # -- podFailurePolicy ----------------------------------------------------------------------
    dict(
        test=PFP,
        case="default handling for pod failure if the container matching the exit codes does not "
        "match the containerName restriction",
        spec=job(
            podFailurePolicy={
                "rules": [
                    {
                        "action": "Ignore",
                        "onExitCodes": {
                            "containerName": "main-container",
                            "operator": "In",
                            "values": [1, 2, 3],
                        },
                    },
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "main-container",
                            "operator": "In",
                            "values": [5, 6, 7],
                        },
                    },
                ]
            }
        ),
        pods=[
            (
                "mypod-0",
                0,
                "Failed",
                {"exit_codes": {"monitoring-container": 5, "main-container": 42}},
            )
        ],
        want=dict(conditions=[], active=1, failed=1, succeeded=0),
    ),
    dict(
        test=PFP,
        case="running pod should not result in job fail based on OnExitCodes",
        spec=job(podFailurePolicy={"rules": ON_EXIT_CODE_RULES}),
        pods=[("mypod-0", 0, "Running", {"exit_codes": {"main-container": 5}})],
        want=dict(conditions=[], active=1, failed=0, succeeded=0),
    ),
    dict(
        test=PFP,
        case="fail job based on OnExitCodes",
        spec=job(podFailurePolicy={"rules": ON_EXIT_CODE_RULES}),
        pods=[("mypod-0", 0, "Failed", {"exit_codes": {"main-container": 5}})],
        want=dict(
            conditions=fail_job(
                "Container main-container for pod default/mypod-0 failed with exit code 5 "
                "matching FailJob rule at index 1"
            ),
            active=0,
            failed=1,
            succeeded=0,
        ),
    ),
    dict(
        test=PFP,
        case="fail job with multiple pods; JobManagedBy enabled delays setting terminal condition",
        spec=job(2, 2, podFailurePolicy={"rules": ON_EXIT_CODE_RULES}),
        pods=[
            ("mypod-0", 0, "Running", {}),
            ("mypod-1", 1, "Failed", {"exit_codes": {"main-container": 5}}),
        ],
        want=dict(
            conditions=fail_job(
                "Container main-container for pod default/mypod-1 failed with exit code 5 "
                "matching FailJob rule at index 1"
            )[:1],
            active=0,
            failed=2,
            succeeded=0,
        ),
    ),
    dict(
        test=PFP,
        case="fail indexed job based on OnExitCodes",
        spec=job(completionMode="Indexed", podFailurePolicy={"rules": ON_EXIT_CODE_RULES}),
        pods=[("mypod-0", 0, "Failed", {"exit_codes": {"main-container": 5}})],
        want=dict(
            conditions=fail_job(
                "Container main-container for pod default/mypod-0 failed with exit code 5 "
                "matching FailJob rule at index 1"
            ),
            active=0,
            failed=1,
            succeeded=0,
        ),
    ),
    dict(
        test=PFP,
        case="fail job based on OnExitCodes with NotIn operator",
        spec=job(
            podFailurePolicy={
                "rules": [
                    {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [5, 6, 7]}}
                ]
            }
        ),
        pods=[("mypod-0", 0, "Failed", {"exit_codes": {"main-container": 42}})],
        want=dict(
            conditions=fail_job(
                "Container main-container for pod default/mypod-0 failed with exit code 42 "
                "matching FailJob rule at index 0"
            ),
            active=0,
            failed=1,
            succeeded=0,
        ),
    ),
    dict(
        test=PFP,
        case="default handling job based on OnExitCodes with NotIn operator",
        spec=job(
            podFailurePolicy={
                "rules": [
                    {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [5, 6, 7]}}
                ]
            }
        ),
        pods=[("mypod-0", 0, "Failed", {"exit_codes": {"main-container": 5}})],
        want=dict(conditions=[], active=1, failed=1, succeeded=0),
    ),
    dict(
        test=PFP,
        case="fail job based on OnExitCodes for InitContainer",
        spec=job(podFailurePolicy={"rules": ON_EXIT_CODE_RULES}),
        pods=[
            (
                "mypod-0",
                0,
                "Failed",
                {"init_exit_codes": {"init-container": 5}, "exit_codes": {"main-container": 143}},
            )
        ],
        want=dict(
            conditions=fail_job(
                "Container init-container for pod default/mypod-0 failed with exit code 5 "
                "matching FailJob rule at index 1"
            ),
            active=0,
            failed=1,
            succeeded=0,
        ),
    ),
    dict(
        test=PFP,
        case="ignore pod failure; both rules are matching, the first is executed only",
        spec=job(backoff_limit=0, podFailurePolicy={"rules": ON_EXIT_CODE_RULES}),
        pods=[("mypod-0", 0, "Failed", {"exit_codes": {"container1": 2, "container2": 6}})],
        want=dict(conditions=[], active=1, failed=0, succeeded=0),
    ),
    dict(
        test=PFP,
        case="ignore pod failure based on OnExitCodes",
        spec=job(backoff_limit=0, podFailurePolicy={"rules": ON_EXIT_CODE_RULES}),
        pods=[("mypod-0", 0, "Failed", {"exit_codes": {"": 1}})],
        want=dict(conditions=[], active=1, failed=0, succeeded=0),
    ),
    dict(
        test=PFP,
        case="default job based on OnExitCodes; JobManagedBy enabled triggers adding interim "
        "condition",
        spec=job(backoff_limit=0, podFailurePolicy={"rules": ON_EXIT_CODE_RULES}),
        pods=[("mypod-0", 0, "Failed", {"exit_codes": {"": 10}})],
        want=dict(
            conditions=[("FailureTarget", *BACKOFF), ("Failed", *BACKOFF)],
            active=0,
            failed=1,
            succeeded=0,
        ),
    ),
    dict(
        test=PFP,
        case="count pod failure based on OnExitCodes; both rules are matching, the first is "
        "executed only",
        spec=job(
            podFailurePolicy={
                "rules": [
                    {"action": "Count", "onExitCodes": {"operator": "In", "values": [1, 2]}},
                    {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [2, 3]}},
                ]
            }
        ),
        pods=[("mypod-0", 0, "Failed", {"exit_codes": {"": 2}})],
        want=dict(conditions=[], active=1, failed=1, succeeded=0),
    ),
    dict(
        test=PFP,
        case="count pod failure based on OnPodConditions; both rules are matching, the first is "
        "executed only",
        spec=job(
            podFailurePolicy={
                "rules": [
                    {
                        "action": "Count",
                        "onPodConditions": [{"type": "ResourceLimitExceeded", "status": "True"}],
                    },
                    {"action": "Ignore", "onPodConditions": DISRUPTION},
                ]
            }
        ),
        pods=[
            ("mypod-0", 0, "Failed", {"conditions": ("ResourceLimitExceeded", "DisruptionTarget")})
        ],
        want=dict(conditions=[], active=1, failed=1, succeeded=0),
    ),
    dict(
        test=PFP,
        case="ignore pod failure based on OnPodConditions",
        spec=job(
            backoff_limit=0,
            podFailurePolicy={"rules": [{"action": "Ignore", "onPodConditions": DISRUPTION}]},
        ),
        pods=[("mypod-0", 0, "Failed", {"conditions": ("DisruptionTarget",)})],
        want=dict(conditions=[], active=1, failed=0, succeeded=0),
    ),
    dict(
        test=PFP,
        case="ignore pod failure based on OnPodConditions, ignored failures delays pod recreation",
        spec=job(
            backoff_limit=0,
            podFailurePolicy={"rules": [{"action": "Ignore", "onPodConditions": DISRUPTION}]},
        ),
        pods=[("mypod-0", 0, "Failed", {"conditions": ("DisruptionTarget",), "deleting": True})],
        want=dict(conditions=[], active=0, failed=0, succeeded=0),
    ),
    dict(
        test=PFP,
        case="fail job based on OnPodConditions",
        spec=job(
            podFailurePolicy={"rules": [{"action": "FailJob", "onPodConditions": DISRUPTION}]}
        ),
        pods=[("mypod-0", 0, "Failed", {"conditions": ("DisruptionTarget",)})],
        want=dict(
            conditions=fail_job(
                "Pod default/mypod-0 has condition DisruptionTarget matching FailJob rule "
                "at index 0"
            ),
            active=0,
            failed=1,
            succeeded=0,
        ),
    ),
    dict(
        test=PFP,
        case="terminating Pod not considered failed when JobPodFailurePolicy is enabled and used",
        spec=job(
            backoff_limit=0,
            podFailurePolicy={"rules": [{"action": "Count", "onPodConditions": DISRUPTION}]},
        ),
        pods=[("mypod-0", 0, "Running", {"deleting": True})],
        want=dict(conditions=[], active=0, failed=0, succeeded=0),
    ),
    # -- backoffLimitPerIndex / maxFailedIndexes -----------------------------------------------
    dict(
        test=BLPI,
        case="successful job after a single failure within index",
        spec=per_index(),
        pods=[
            ("a1", 0, "Failed", {}),
            ("a2", 0, "Succeeded", {"failure_count": 1}),
            ("b", 1, "Succeeded", {}),
        ],
        want=dict(
            failed=1,
            succeeded=2,
            terminating=0,
            completed_indexes="0,1",
            failed_indexes="",
            conditions=[("SuccessCriteriaMet", *DONE), ("Complete", *DONE)],
        ),
    ),
    dict(
        test=BLPI,
        case="single failed pod replaced already",
        spec=per_index(),
        pods=[("a", 0, "Failed", {}), ("b", 0, "Pending", {"failure_count": 1})],
        want=dict(active=2, failed=1, terminating=0, failed_indexes="", conditions=[]),
    ),
    dict(
        test=BLPI,
        case="single failed index due to exceeding the backoff limit per index, the job continues",
        spec=per_index(),
        pods=[("a", 0, "Failed", {"failure_count": 1})],
        want=dict(active=1, failed=1, failed_indexes="0", terminating=0, conditions=[]),
    ),
    dict(
        test=BLPI,
        case="single failed index due to FailIndex action, the job continues",
        spec=per_index(
            podFailurePolicy={
                "rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [3]}}]
            }
        ),
        pods=[("a", 0, "Failed", {"exit_codes": {"": 3}})],
        want=dict(active=1, failed=1, failed_indexes="0", terminating=0, conditions=[]),
    ),
    dict(
        test=BLPI,
        case="job failed index due to FailJob action",
        spec=per_index(
            backoff_limit=6,
            podFailurePolicy={
                "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]
            },
        ),
        pods=[("mypod-0", 0, "Failed", {"exit_codes": {"x": 3}})],
        want=dict(
            active=0,
            failed=1,
            failed_indexes="",
            terminating=0,
            conditions=fail_job(
                "Container x for pod default/mypod-0 failed with exit code 3 matching FailJob "
                "rule at index 0"
            ),
        ),
    ),
    dict(
        test=BLPI,
        case="job pod failure ignored due to matching Ignore action",
        spec=per_index(
            backoff_limit=6,
            podFailurePolicy={
                "rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [3]}}]
            },
        ),
        pods=[("a", 0, "Failed", {"exit_codes": {"x": 3}})],
        want=dict(active=2, failed=0, failed_indexes="", terminating=0, conditions=[]),
    ),
    dict(
        test=BLPI,
        case="job failed due to exceeding backoffLimit before backoffLimitPerIndex",
        spec=per_index(backoff_limit=1),
        pods=[("a", 0, "Failed", {}), ("b", 1, "Failed", {})],
        want=dict(
            failed=2,
            succeeded=0,
            failed_indexes="",
            terminating=0,
            conditions=[("FailureTarget", *BACKOFF), ("Failed", *BACKOFF)],
        ),
    ),
    dict(
        test=BLPI,
        case="job failed due to failed indexes; JobManagedBy enabled",
        spec=per_index(),
        pods=[("a", 0, "Failed", {"failure_count": 1}), ("b", 1, "Succeeded", {})],
        want=dict(
            failed=1,
            succeeded=1,
            failed_indexes="0",
            completed_indexes="1",
            conditions=[("FailureTarget", *FAILED_INDEXES), ("Failed", *FAILED_INDEXES)],
        ),
    ),
    dict(
        test=BLPI,
        case="job failed due to exceeding max failed indexes",
        spec=per_index(4, 4, maxFailedIndexes=1),
        pods=[
            ("a", 0, "Failed", {"failure_count": 1}),
            ("b", 1, "Succeeded", {}),
            ("c", 2, "Failed", {"failure_count": 1}),
            ("d", 3, "Running", {}),
        ],
        want=dict(
            failed=3,
            succeeded=1,
            terminating=1,
            failed_indexes="0,2",
            completed_indexes="1",
            conditions=[("FailureTarget", *MAX_FAILED)],
        ),
    ),
    # -- success, start, suspend ---------------------------------------------------------------
    dict(
        test=SP,
        case="job without successPolicy; jobSuccessPolicy is enabled; job got SuccessCriteriaMet "
        "and "
        "Completion with CompletionsReached reason conditions",
        spec=job(backoff_limit=MAX_INT32, completionMode="Indexed"),
        pods=[("a1", 0, "Succeeded", {})],
        want=dict(
            failed=0,
            succeeded=1,
            completed_indexes="0",
            conditions=[("SuccessCriteriaMet", *DONE), ("Complete", *DONE)],
        ),
    ),
    dict(
        test=CSJ,
        case="job start",
        spec=job(2, 5),
        pods=[],
        want=dict(active=2, created=2, conditions=[]),
    ),
    dict(
        test=CSJ,
        case="too few active pods",
        spec=job(2, 5),
        pods=[("p0", 0, "Running", {}), ("p1", 1, "Succeeded", {})],
        want=dict(active=2, created=1, succeeded=1, conditions=[]),
    ),
    dict(
        test=CSJ,
        case="suspending a job with satisfied expectations",
        spec=job(2, 4, suspend=True),
        pods=[("p0", 0, "Running", {}), ("p1", 1, "Running", {})],
        want=dict(
            active=0,
            created=0,
            deleted=2,
            conditions=[("Suspended", "JobSuspended", "Job suspended")],
        ),
    ),
]
