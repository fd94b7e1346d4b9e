class Square:
    """A square of side s."""

    def __init__(self, s):
        self.s = s

    def area(self):
        
