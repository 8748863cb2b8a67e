"""Independent reference models, written from primary sources, to check the emulator against."""
