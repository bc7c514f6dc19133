#!/usr/bin/env bash
# compat.device_view: `softrdma run` shows every device of our library where the kernel would
# (/sys/class/infiniband, /sys/class/infiniband_verbs, /dev/infiniband), with the values the
# library reports, and nothing else the program sees changes: ids, pid/net namespaces, addresses,
# the other /sys/class and /dev entries, a shared /dev/shm; the host's /sys and /dev stay as they
# were. As root, as a throwaway uid (user namespace), inside a network namespace on a veth, and
# where no namespace can be made (the program runs without the view).
set -euo pipefail

# --probe: what a program sees, in a form to compare inside and outside the view. The view's own
# entries are left out; owners only where they must not change (VIEW_OWNERS=1).
if [[ ${1:-} == --probe ]]; then
  own=${VIEW_OWNERS:-0}
  echo "id: $(id)"
  for ns in pid net ipc uts cgroup; do echo "ns/$ns: $(readlink /proc/self/ns/$ns)"; done
  ip -o addr | sed 's/^/addr: /'
  ls -A /sys/class | grep -vx -e infiniband -e infiniband_verbs | sed 's/^/class: /'
  ls -A /sys/bus | grep -vx softrdma | sed 's/^/bus: /'
  for n in /sys/class/net/*; do echo "net: $n -> $(readlink -f "$n") $(cat "$n/ifindex")"; done
  fmt='%p %y %m %l'
  ((own)) && fmt+=' %u %g'
  find /dev -mindepth 1 \( -path /dev/infiniband -o -path /dev/shm -o -path /dev/pts \) -prune -o \
    -printf "dev: $fmt\n" | sort
  # -type reads readdir's d_type; without privileges a block device is bound onto a regular
  # file (docs/device-view.md), so only character devices are compared that way there.
  types=(-type c)
  ((own)) && types=(\( -type c -o -type b \))
  find /dev -mindepth 1 -maxdepth 1 "${types[@]}" -printf '%p\n' | sort | xargs -r stat -c 'rdev: %n %t:%T'
  stat -c 'fs: %n %T %a' /dev/shm /dev/pts
  exit 0
fi

. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma
self=$(realpath "${BASH_SOURCE[0]}")
PAIR_SRV_LOG=/dev/null
PAIR_CLI_LOG=/dev/null
out=$COMPAT_LOG_DIR/view
mkdir -p "$out"
chmod 755 "$COMPAT_LOG_DIR" "$out"
cd / # readable by the throwaway uid too
THROWAWAY=54321 # no account of this host; 65534 would hide the overflow uid it must show

# host_state: the host's /sys/class, /sys/bus and /dev names, to compare before and after
# (not /dev/shm's: the library itself creates files there).
host_state() { ls -A /sys/class /sys/bus /dev 2>&1; }

# expect NAME WANT GOT
expect() {
  if [[ $2 == "$3" ]]; then compat_result "$1" 1; else compat_result "$1" 0 "want [$2], got [$3]"; fi
}

# check_view LABEL OWNERS NODE_KIND PREFIX...: the view of `PREFIX softrdma run`, against what
# PREFIX alone sees. NODE_KIND: "uverbs" (231:192+N) or "null" (/dev/null bound in place).
check_view() {
  local label=$1 owners=$2 node=$3
  shift 3
  local -a pre=("$@")
  local before after f_in f_out
  before=$(host_state)
  f_out=/dev/shm/softrdma-view-$$-$RANDOM-out
  f_in=/dev/shm/softrdma-view-$$-$RANDOM-in
  "${pre[@]}" touch "$f_out"

  # The same probe, with and without the view.
  VIEW_OWNERS=$owners "${pre[@]}" "$self" --probe >"$out/$label.outside" 2>&1
  local rc=0
  VIEW_OWNERS=$owners "${pre[@]}" "$SOFTRDMA" run --print-env -- "$self" --probe \
    >"$out/$label.inside" 2>"$out/$label.stderr" || rc=$?
  if ((rc != 0)); then
    compat_result "$label: probe runs in the view" 0 "exit $rc: $(cat "$out/$label.stderr")"
  fi
  local diff
  if diff=$(diff "$out/$label.outside" "$out/$label.inside"); then
    compat_result "$label: ids, namespaces, addresses, /sys/class, /sys/bus, /dev unchanged" 1
  else
    compat_result "$label: ids, namespaces, addresses, /sys/class, /sys/bus, /dev unchanged" 0 \
      "outside (<) and inside (>) differ: $diff"
  fi
  expect "$label: view in place ($(grep -o 'device view: .*' "$out/$label.stderr" || true))" 1 \
    "$(grep -c "device view: $([[ $node == uverbs ]] && echo 'mount namespace' || echo 'user and mount namespace')" \
      "$out/$label.stderr" || true)"

  # /dev/shm is the host's: each side sees the other's file.
  local shm
  shm=$("${pre[@]}" "$SOFTRDMA" run -- sh -c "test -e $f_out && touch $f_in && echo ok" 2>&1 || true)
  if [[ $shm == ok ]] && "${pre[@]}" test -e "$f_in"; then
    compat_result "$label: /dev/shm shared both ways" 1
  else
    compat_result "$label: /dev/shm shared both ways" 0 "inside said [$shm]; $f_in outside: $(ls -l "$f_in" 2>&1)"
  fi
  rm -f "$f_in" "$f_out"

  # Each device: its files hold what the library reports.
  local devs dev
  devs=$("${pre[@]}" "$SOFTRDMA" devices | sed -n 's/^hca_id:\t//p')
  expect "$label: one /sys/class/infiniband entry per device" "$(sort <<<"$devs")" \
    "$("${pre[@]}" "$SOFTRDMA" run -- ls /sys/class/infiniband 2>/dev/null | sort)"
  for dev in $devs; do
    local info guid ip gidhex ifname want got
    info=$("${pre[@]}" "$SOFTRDMA" devices -d "$dev")
    guid=$(sed -n 's/^\tnode_guid:\t*//p' <<<"$info")
    ip=$(sed -n 's/.*GID\[  0\]:.*(IPv4 \(.*\))/\1/p' <<<"$info")
    if [[ -n $ip ]]; then
      # shellcheck disable=SC2046
      gidhex=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' $(tr . ' ' <<<"$ip"))
      ifname=$("${pre[@]}" ip -o -4 addr show | awk -v ip="$ip" '{ split($4, a, "/"); if (a[1] == ip) print $2 }' | head -n1)
    else  # a device of an IPv6 address (softrdma6_*): the GID is the address
      ip=$(sed -n 's/.*GID\[  0\]:[[:space:]]*\([0-9a-f:]*\), RoCE v2.*/\1/p' <<<"$info")
      gidhex=$(python3 -c 'import ipaddress,sys; h=ipaddress.IPv6Address(sys.argv[1]).exploded; print(h)' "$ip")
      ifname=$("${pre[@]}" ip -o -6 addr show | awk -v ip="$ip" '{ split($4, a, "/"); if (a[1] == ip) print $2 }' | head -n1)
    fi
    local d=/sys/class/infiniband/$dev p=/sys/class/infiniband/$dev/ports/1
    want="$guid|1: CA|4: ACTIVE|5: LinkUp|Ethernet|$gidhex|RoCE v2|$ifname|$ifname|softrdma|ok"
    got=$("${pre[@]}" "$SOFTRDMA" run -- sh -c "
      cat $d/node_guid $d/node_type $p/state $p/phys_state $p/link_layer $p/gids/0 \
          $p/gid_attrs/types/0 $p/gid_attrs/ndevs/0 | tr '\n' '|'
      ls $d/device/net | tr '\n' '|'
      basename \"\$(readlink $d/device/driver)\" | tr '\n' '|'
      test -d $d/device/driver -a \"\$(cat $d/device/net/$ifname/ifindex)\" = \"\$(cat /sys/class/net/$ifname/ifindex)\" && echo ok" 2>&1 || true)
    expect "$label: $dev: guid, type, state, link, gid, gid type, ndev, device/net, driver" "$want" "$got"

    # Its uverbs node: the class entry naming it, and a char device open for reading and writing.
    got=$("${pre[@]}" "$SOFTRDMA" run -- sh -c "
      for u in /sys/class/infiniband_verbs/uverbs*; do
        [ \"\$(cat \$u/ibdev)\" = $dev ] || continue
        n=\${u##*uverbs}; echo \"\$n \$(cat \$u/dev) \$(cat \$u/abi_version)\"
        f=/dev/infiniband/uverbs\$n
        test -c \$f -a -r \$f -a -w \$f && stat -c '%t:%T %a' \$f
      done" 2>&1 || true)
    local n=${got%% *}
    if [[ $node == uverbs ]]; then
      want="$n 231:$((192 + n)) 6"$'\n'"e7:$(printf '%x' $((192 + n))) 666"
    else
      want="$n 231:$((192 + n)) 6"$'\n'"1:3 666"
    fi
    expect "$label: $dev: uverbs$n (ibdev, dev, abi_version; test -c -r -w; rdev, mode)" "$want" "$got"
  done

  after=$(host_state)
  expect "$label: the host's /sys/class, /sys/bus, /dev unchanged after the runs" "$before" "$after"
  if [[ -e /dev/infiniband || -e /sys/class/infiniband ]]; then
    compat_result "$label: no /dev/infiniband, /sys/class/infiniband on the host" 0 "$(ls -d /dev/infiniband /sys/class/infiniband 2>&1)"
  else
    compat_result "$label: no /dev/infiniband, /sys/class/infiniband on the host" 1
  fi
}

if [[ -e /dev/infiniband || -e /sys/class/infiniband ]]; then
  echo "SKIP: this host has a kernel RDMA stack (/dev/infiniband or /sys/class/infiniband)"
  exit 77
fi

if [[ $(id -u) == 0 ]]; then
  check_view root 1 uverbs env
  # A throwaway uid: a user namespace mapping it to itself, so id and files stay as they were
  # apart from owners, which are left out (files of other users show as the overflow uid).
  user=(setpriv --reuid=$THROWAWAY --regid=$THROWAWAY --clear-groups)
  check_view user 0 null "${user[@]}"
else
  check_view user 0 null env
fi

# Opting out, and the settings consumers need.
expect "--no-view: no /dev/infiniband" no "$("$SOFTRDMA" run --no-view sh -c 'test -e /dev/infiniband && echo yes || echo no')"
expect "SOFTRDMA_VIEW=0: no /sys/class/infiniband" no \
  "$(SOFTRDMA_VIEW=0 "$SOFTRDMA" run sh -c 'test -e /sys/class/infiniband && echo yes || echo no')"
expect "run sets OMPI_MCA_opal_common_ucx_devices=any" any \
  "$("$SOFTRDMA" run --no-view printenv OMPI_MCA_opal_common_ucx_devices)"
expect "run keeps the user's OMPI_MCA_opal_common_ucx_devices" 'mlx5_0' \
  "$(OMPI_MCA_opal_common_ucx_devices=mlx5_0 "$SOFTRDMA" run --no-view printenv OMPI_MCA_opal_common_ucx_devices)"

if [[ $(id -u) == 0 ]]; then
  # Where no namespace can be made (a user namespace whose user namespaces are capped at 0, and a
  # uid without privileges there), the program runs anyway without the view, with a note.
  # util-linux's unshare needs newuidmap to map a range, so the map is written from here; the
  # shell then execs itself, to gain the capabilities of the namespace's root with the map.
  cat >"$out/none.sh" <<EOF
if [ "\$1" = wait ]; then
  while [ -z "\$(cat /proc/self/uid_map)" ]; do sleep 0.05; done
  exec sh "\$0" capped
fi
echo 0 >/proc/sys/user/max_user_namespaces || exit 100
exec setpriv --reuid=$THROWAWAY --regid=$THROWAWAY --clear-groups \\
  "$SOFTRDMA" run sh -c 'test -e /dev/infiniband && echo view || echo noview; exit 3'
EOF
  unshare -U sh "$out/none.sh" wait >"$out/none.stdout" 2>"$out/none.stderr" &
  upid=$!
  for ((i = 0; i < 100; i++)); do
    [[ $(readlink "/proc/$upid/ns/user" 2>/dev/null) != "$(readlink /proc/self/ns/user)" ]] && break
    sleep 0.05
  done
  { echo '0 0 65536' >"/proc/$upid/uid_map" && echo '0 0 65536' >"/proc/$upid/gid_map"; } || kill "$upid"
  rc=0
  wait "$upid" || rc=$?
  got="$(cat "$out/none.stdout")"$'\n'"exit $rc"
  expect "no namespace possible: the program runs without the view, exit status kept" "noview"$'\n'"exit 3" "$got"
  expect "no namespace possible: one line on stderr says so" 1 \
    "$(grep -c '^softrdma run: running without the device view' "$out/none.stderr" || true)"

  # Inside a network namespace: the devices are those of that namespace (its lo and the veth).
  compat_netns_setup
  check_view netns 1 uverbs "${inA[@]}"
  expect "netns: $devA's ndev is the veth" "$vethA" \
    "$("${inA[@]}" "$SOFTRDMA" run cat "/sys/class/infiniband/$devA/ports/1/gid_attrs/ndevs/0")"
fi

compat_finish
