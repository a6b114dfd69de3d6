# Sourced by the launch scripts: the environment memtrain's ranks want on one
# machine or a cluster node. Each knob says why.

# Open MPI refuses to start as root unless told; containers run as root.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# More ranks than cores is fine for small runs and tests.
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
# Shared-memory single-copy (CMA) needs ptrace rights containers often lack.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
# Threads per rank: memtrain sets LibTorch's and OpenBLAS's thread counts
# from the rank's CPU affinity mask (Note [Threads per rank]); an exported
# OMP_NUM_THREADS can only lower them. Nothing to set here.
# HDF5 file locking fails on many Lustre/NFS mounts; reads are read-only.
export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-FALSE}
# Debug knobs, ready to enable:
# export OMPI_MCA_btl_base_verbose=100     # which transport MPI picked
# export NCCL_DEBUG=INFO                   # (CUDA builds) NCCL's choices
