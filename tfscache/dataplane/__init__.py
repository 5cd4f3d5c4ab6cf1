"""HAProxy as tfscache's data plane (``server.data_plane = "haproxy"``; docs/data-plane.md).

binary.py checks the ``haproxy`` binary at start-up; config.py writes haproxy.cfg from a Plan
(pure); targets.py decides which nodes or peer a model's route names (pure); routes.py holds
the routes as leases; runtime.py speaks the runtime API; process.py supervises the child;
certs.py writes the TLS files HAProxy reads; requests.py reads HAProxy's log of routed
requests; control.py (``DataPlane``) wires them into the control loop.
"""
