# Sourced from the checkout's root by scripts/setup.sh and by the GPU check's
# bundle build: ccache's settings, alike for every build directory of the tree.
# The precompiled header is compatible with ccache only with these sloppiness settings.
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
# Paths relative to the checkout, so a fresh clone elsewhere still hits the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
# An object compiled alike in two build directories (the main one and the GPU
# check's bundle) is one cache entry: the working directory, which differs,
# is left out of the hash (it only names the debug information's build folder).
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
# Depend mode: a miss is hashed from the compiler's own dependency file (-MD,
# which CMake passes), not by running the preprocessor over every torch header
# first.
export CCACHE_DEPEND=${CCACHE_DEPEND:-1}
