# Sourced by the launch scripts: the environment memtrain's ranks want on one
# machine or a cluster node. Each knob says why.

# Open MPI refuses to start as root unless told; containers run as root.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# More ranks than cores is fine for small runs and tests.
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
# Between hosts over TCP, two connections per pair of ranks: with one,
# Open MPI moved one direction at a time (tests/multinode's emulated
# 1 Gbit/s links, 2 nodes x 1 rank, 16 MiB MPI_Allreduce: 0.48 of the
# link's bound with one, 0.91 with two; one run, benchmarks/README.md).
export OMPI_MCA_btl_tcp_links=${OMPI_MCA_btl_tcp_links:-2}
# Shared-memory single-copy (CMA) needs ptrace rights containers often lack.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
# Threads per rank: memtrain sets LibTorch's and OpenBLAS's thread counts
# from the rank's CPU affinity mask (Note [Threads per rank]); an exported
# OMP_NUM_THREADS can only lower them. Nothing to set here.
# Cores per rank: memtrain_binding N sets MEMTRAIN_BINDING to mpirun's
# arguments that bind each of N ranks on this machine to floor(CPUs / N)
# CPUs of its own (hardware threads; Open MPI's --map-by slot:PE=n), so its
# reader threads, autograd's device thread and LibTorch's pool run on its
# share and memtrain sizes the pool by it. Open MPI's default binds each
# rank to one core (2 ranks or fewer; to a socket above). More ranks than
# CPUs (small tests): no binding; memtrain shares the CPUs out among them.
#   memtrain_binding 2; mpirun -np 2 "${MEMTRAIN_BINDING[@]}" build/memtrain ...
memtrain_binding() {
  # nproc: the CPUs this shell may run on (OMP_NUM_THREADS would lower it).
  local per=$(($(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) / $1))
  if [ "$per" -ge 1 ]; then
    MEMTRAIN_BINDING=(--use-hwthread-cpus --map-by "slot:PE=$per" --bind-to hwthread)
  else
    MEMTRAIN_BINDING=(--bind-to none)
  fi
}
# HDF5 file locking fails on many Lustre/NFS mounts; reads are read-only.
export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-FALSE}
# Debug knobs, ready to enable:
# export OMPI_MCA_btl_base_verbose=100     # which transport MPI picked
# export NCCL_DEBUG=INFO                   # (CUDA builds) NCCL's choices
