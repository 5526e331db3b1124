"""On the first host: listen on ADDRESS for SECONDS until HOSTS hosts connected; print
``@@PORT <port> <spare>`` first (spare: a second port free there, the all_reduce's master port).
Arguments: ADDRESS SECONDS HOSTS.
"""

import socket
import sys
import time


def main() -> None:
    address, seconds, hosts = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    spare = socket.socket()
    spare.bind((address, 0))
    port2 = spare.getsockname()[1]
    spare.close()  # never connected: free for the all_reduce's master
    s = socket.socket()
    s.bind((address, 0))
    s.listen(16)
    print("@@PORT", s.getsockname()[1], port2, flush=True)
    end = time.time() + seconds
    left = hosts  # exit once every host connected
    while left > 0 and time.time() < end:
        s.settimeout(max(0.1, end - time.time()))
        try:
            c, _ = s.accept()
        except OSError:
            break
        c.close()
        left -= 1


if __name__ == "__main__":
    main()
