"""helpers/: fakes, shared settings, subprocess workers and the toy method (no tests here)"""
