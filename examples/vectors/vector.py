class Vector:
    """A 2D vector."""

    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __add__(self, other):
        

    def __sub__(self, other):
        return Vector(self.x - other.x, self.y - other.y)

    def __mul__(self, k):
        return Vector(self.x * k, self.y * k)

    def __truediv__(self, k):