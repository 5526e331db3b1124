"""On each host: join a gloo group over the link, all-reduce a scalar and a large tensor;
print ``@@AR{json}`` (the sum, the large one's seconds, whether it was right, the total time).
Argument: a JSON object with ``rank``, ``world``, ``master``, ``env``, ``timeout``, ``nbytes``.
"""

import datetime
import json
import os
import sys
import time


def main() -> None:
    t0 = time.perf_counter()
    import torch
    import torch.distributed as dist

    a = json.loads(sys.argv[1])
    os.environ.update(a["env"])  # GLOO_SOCKET_IFNAME before the group is built
    dist.init_process_group("gloo", init_method=f"tcp://{a['master']}", rank=a["rank"],
                            world_size=a["world"],
                            timeout=datetime.timedelta(seconds=a["timeout"]))
    t = torch.tensor([float(a["rank"] + 1)])
    dist.all_reduce(t)
    big = torch.ones(a["nbytes"] // 4)
    dist.barrier()
    t1 = time.perf_counter()
    dist.all_reduce(big)
    dt = time.perf_counter() - t1
    dist.destroy_process_group()
    print("@@AR" + json.dumps({"sum": float(t.item()), "seconds": dt,
                               "big_ok": float(big[0]) == a["world"],
                               "total": time.perf_counter() - t0}))


if __name__ == "__main__":
    main()
