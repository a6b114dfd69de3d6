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
# memtrain sets LibTorch's threads to cores / local ranks itself; keep OpenMP
# from starting its own pool per rank on top.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# HDF5 file locking fails on many Lustre/NFS mounts; reads are read-only.
export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-FALSE}
# Debug knobs, ready to enable:
# export OMPI_MCA_btl_base_verbose=100     # which transport MPI picked
# export NCCL_DEBUG=INFO                   # (CUDA builds) NCCL's choices
