"""CPU (llvm) schedule templates."""
