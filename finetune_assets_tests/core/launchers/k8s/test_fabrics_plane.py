"""A pod template the namespace's Pod Security admission refuses fails the launch at once, with
the API server's reason, instead of waiting start_timeout_s for pods that are never created (the
real Job controller's FailedCreate event, the real PodSecurity admission).
"""

from __future__ import annotations

import pytest

from finetune_assets_tests.core.launchers.k8s.helpers import launch_in_dagster
from finetune_assets_tests.core.launchers.k8s.plane_objects import cluster_in, namespace

pytestmark = pytest.mark.control_plane


def test_host_network_in_a_restricted_namespace_fails_at_once_with_the_reason(
    control_plane, instance
) -> None:
    ns = namespace(
        control_plane, "fabric-restricted", {"pod-security.kubernetes.io/enforce": "restricted"}
    )
    # a launcher told the namespace is privileged when it is not
    launcher = cluster_in(control_plane, ns).launcher(
        host_network=True, pod_security_level="privileged", start_timeout_s=1800
    )
    launched = launch_in_dagster(launcher, "standin:ok", instance)
    assert not launched.success
    assert "the API server refuses the pods" in launched.logs
    assert 'violates PodSecurity "restricted:latest": host namespaces' in launched.logs
    assert "start_timeout_s" not in launched.logs.split("the API server refuses")[1][:300]
