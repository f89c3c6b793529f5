#!/usr/bin/python
"""Ansible module: put one Spark in or out of rotation at the router (HAProxy's admin socket)."""

DOCUMENTATION = r"""
module: kvtier_router_backend
short_description: Drain a Spark at the router, or make it ready again, and wait until that took effect
description:
  - Sets one server of the router's backend to C(drain) (finishes what it has, takes no new request), C(ready)
    or C(maint) through HAProxy's admin socket, and waits for what that state promises.
  - With O(state=drain) and O(wait), returns once the server has no session left (every request the router sent
    it was answered). With O(state=ready) and O(wait), returns once its health checks pass (status UP).
  - C(changed) only when the state was different. Check mode reads the state and reports what would change.
options:
  socket: {description: HAProxy's admin socket., type: path, required: true}
  backend: {description: The router's backend., type: str, required: true}
  server: {description: The server (the Spark's inventory name)., type: str, required: true}
  state:
    description:
      - Admin state to set.
      - Left out, nothing is set, and O(wait) waits until the server passes its health checks (UP, or DRAIN).
    type: str
    choices: [ready, drain, maint]
  wait: {description: Wait until the state took effect (see above)., type: bool, default: true}
  keep_one_up:
    description:
      - Refuse to drain (or put in maintenance) the server when no other server of the backend is UP and ready:
        the router would have nowhere to send a request.
    type: bool
    default: true
  timeout: {description: Seconds to wait., type: float, default: 300}
"""

EXAMPLES = r"""
- name: Take spark02 out of rotation and wait until its requests are answered
  kvtier_router_backend:
    socket: /run/haproxy/kvtier.sock
    backend: vllm
    server: spark02
    state: drain
  delegate_to: "{{ groups['kvtier_router'] | first }}"
"""

RETURN = r"""
before: {description: "The server before: status, sessions, queued, weight, check.", returned: always, type: dict}
server: {description: The server after the change (and the wait)., returned: always, type: dict}
backend_servers: {description: Every server of the backend after the change., returned: always, type: dict}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kvtier_router import (
    RouterError,
    server_admin_state,
    servers,
    set_state,
    wait_idle,
    wait_status,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "socket": {"type": "path", "required": True},
            "backend": {"type": "str", "required": True},
            "server": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["ready", "drain", "maint"]},
            "wait": {"type": "bool", "default": True},
            "timeout": {"type": "float", "default": 300},
            "keep_one_up": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        every = servers(p["socket"], p["backend"])
        if p["server"] not in every:
            module.fail_json(
                msg=f"the router's backend {p['backend']} has no server {p['server']} "
                f"(it has {', '.join(sorted(every))}): run site.yml (the router role) after adding a Spark"
            )
        before = every[p["server"]]
        changed = p["state"] is not None and server_admin_state(p["socket"], p["backend"], p["server"]) != p["state"]
        others_up = sorted(name for name, s in every.items() if name != p["server"] and s["status"] == "UP")
        if changed and p["state"] in ("drain", "maint") and p["keep_one_up"] and not others_up:
            module.fail_json(
                msg=f"taking {p['server']} out would leave no Spark in rotation at the router (the others: "
                + (", ".join(f"{n} {s['status']}" for n, s in sorted(every.items()) if n != p["server"]) or "none")
                + "): bring another Spark back first",
                backend_servers=every,
            )
        if changed and not module.check_mode:
            set_state(p["socket"], p["backend"], p["server"], p["state"])
        after = before
        if p["wait"] and not module.check_mode:
            if p["state"] == "drain":
                after = wait_idle(p["socket"], p["backend"], p["server"], p["timeout"])
            elif p["state"] == "ready":
                after = wait_status(p["socket"], p["backend"], p["server"], ("UP",), p["timeout"])
            elif p["state"] == "maint":
                after = servers(p["socket"], p["backend"])[p["server"]]
            else:  # read only: healthy, whether it takes requests (UP) or an operator drained it (DRAIN)
                after = wait_status(p["socket"], p["backend"], p["server"], ("UP", "DRAIN"), p["timeout"])
        every = servers(p["socket"], p["backend"])
    except RouterError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=changed, before=before, server=after, backend_servers=every)


if __name__ == "__main__":
    main()
