"""Fast fabrics as configuration: device resources pass everywhere; hostNetwork, IPC_LOCK and
hostPath are refused, with the reason, where the namespace's Pod Security level would refuse them.
"""

from __future__ import annotations

import pytest

from finetune_assets.core.launchers.base import TrainingSpec
from finetune_assets.defs.resources.k8s_launcher import K8sTorchrunLauncher


def launcher(**kw) -> K8sTorchrunLauncher:
    return K8sTorchrunLauncher(image="img", load_incluster_config=False, **kw)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"host_network": True}, "hostNetwork: true (host namespaces)"),
        (
            {
                "k8s_config": {
                    "container_config": {"securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}
                }
            },
            "capabilities.add ['IPC_LOCK']",
        ),
        (
            {
                "k8s_config": {
                    "pod_spec_config": {
                        "volumes": [
                            {"name": "nccl", "hostPath": {"path": "/home/kubernetes/bin/nvidia"}}
                        ]
                    }
                }
            },
            "hostPath volume(s) ['nccl']",
        ),
    ],
)
def test_refused_where_restricted_would_refuse_the_pods(fields, says: str) -> None:
    with pytest.raises(ValueError, match="Pod Security 'restricted'") as e:
        launcher(**fields)
    assert says in str(e.value) and "pod_security_level='privileged'" in str(e.value)


def test_ipc_lock_is_refused_by_baseline_too_but_not_by_privileged() -> None:
    ipc = {"container_config": {"securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}}
    with pytest.raises(ValueError, match="Pod Security 'baseline'"):
        launcher(k8s_config=ipc, pod_security_level="baseline")
    launcher(k8s_config=ipc, pod_security_level="privileged")


def test_host_network_and_device_resources_are_rendered_when_allowed() -> None:
    got = launcher(
        host_network=True,
        pod_security_level="privileged",
        gpus_per_node=8,
        extra_resources={"vpc.amazonaws.com/efa": "32"},
    )
    spec = TrainingSpec(name="t", config_url="c.json", labels={}, env={})
    _, job = got.render(spec, "t-1", "img")
    pod = job["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    res = pod["containers"][0]["resources"]
    assert res["requests"]["vpc.amazonaws.com/efa"] == res["limits"]["vpc.amazonaws.com/efa"]


def test_device_resources_alone_pass_restricted() -> None:
    launcher(extra_resources={"rdma/rdma_shared_device_a": "1"})
