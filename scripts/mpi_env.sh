# Sourced by the launch and test scripts: lets Open MPI run as root (containers,
# CI) and oversubscribe cores, so nobody has to set these by hand.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Cross-memory attach needs ptrace rights that containers often deny.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
