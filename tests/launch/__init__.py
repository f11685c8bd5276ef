"""launch/: the command lines of launch/, scripts/ and bench/"""
